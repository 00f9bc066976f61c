"""The page in a real browser: Chromium, driven by Playwright, at a desktop's width and a 390-pixel
phone's. It translates a sentence as it streams in and opens on cross-attention with the pieces
shown as words; it shows only the controls that apply; long outputs scroll; errors clear stale
views; its colours pass WCAG AA; nothing is fetched from elsewhere. Screenshots go to
$ATTNKIT_TEST_ARTIFACTS, else test-artifacts/."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from attnkit.serve.app import create_app
from attnkit.serve.runs import served_runs
from tests.helpers import ARTIFACTS, BROWSER_FLAGS, CHROMIUM, tiny_run
from tests.serve.live import serving

DESKTOP = {"width": 1280, "height": 1000}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def page_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("runs")
    runs = [
        f"mt={tiny_run(tmp / 'mt', 'encoder-decoder', max_len=64, kind='bpe')}",
        f"gpt={tiny_run(tmp / 'gpt', 'decoder', max_len=64, positional='rope')}",
        f"bert={tiny_run(tmp / 'bert', 'encoder', positional='learned')}",
    ]
    with serving(create_app(served_runs(runs))) as address:
        yield address + "/"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).is_file(), "Chromium is missing: apt-get install chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_FLAGS)
        yield browser
        browser.close()


def _open(browser: Browser, page_url: str, viewport: dict) -> tuple[Page, list[str]]:
    page = browser.new_page(viewport=viewport)
    failed: list[str] = []
    # a picture whose model changed before it came is cancelled by the browser: not a failure
    page.on(
        "requestfailed",
        lambda r: None if "ERR_ABORTED" in (r.failure or "") else failed.append(r.url),
    )
    page.on("request", lambda r: failed.append(r.url) if not r.url.startswith(page_url) else None)
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.goto(page_url)
    expect(page.locator("#model")).to_have_value("mt")
    return page, failed


def _run(page: Page, text: str) -> None:
    page.fill("#text", text)
    page.click("#go")
    expect(page.locator("#result")).to_have_attribute("data-done", "yes", timeout=30_000)


def _contrast(page: Page, selector: str, background: str) -> float:
    """WCAG's contrast ratio of an element's text colour on another element's background."""
    colours = page.evaluate(
        """([a, b]) => [getComputedStyle(document.querySelector(a)).color,
                        getComputedStyle(document.querySelector(b)).backgroundColor]""",
        [selector, background],
    )

    def luminance(css: str) -> float:
        channels = [int(x) / 255 for x in re.findall(r"\d+", css)[:3]]
        linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    light, dark = sorted(map(luminance, colours), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def test_a_translation_opens_on_cross_attention_with_words(browser: Browser, page_url: str) -> None:
    page, failed = _open(browser, page_url, DESKTOP)
    expect(page.locator("#shape")).to_have_text("encoder-decoder")
    page.select_option("#decoding", "greedy")
    page.fill("#max_tokens", "8")
    _run(page, "ein hund läuft")
    expect(page.locator("#inside")).to_be_visible()
    assert page.locator("#kind").input_value() == "cross"  # what links it to its source
    assert page.locator("#kind option").all_inner_texts() == [
        "cross-attention", "encoder self-attention", "decoder self-attention",
    ]  # fmt: skip
    words = page.locator("#lines text").evaluate_all("ts => ts.map(t => t.textContent)")
    assert "hund" in words and not any("▁" in w for w in words)  # pieces read as words
    expect(page.locator("#heat-rows")).to_have_text("rows: queries, the translation's tokens")
    expect(page.locator("#heat-columns")).to_have_text("columns: keys, the source's tokens")
    page.select_option("#layer", "0")
    page.select_option("#head", "1")
    page.locator("#lines text").first.hover()  # the first query token: only its lines stay
    visible = page.locator("#lines line:visible")
    assert 0 < visible.count() < page.locator("#lines line").count()
    assert set(visible.evaluate_all("lines => lines.map(l => l.dataset.q)")) == {"0"}
    assert page.evaluate("document.getElementById('heat').width") > 100
    page.wait_for_function("document.getElementById('pe').naturalWidth > 0")
    assert page.locator("#positions-title").inner_text() == "Positions: the sinusoidal encoding"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "serve_page.png"), full_page=True)
    page.close()
    assert failed == []  # nothing failed, nothing fetched from elsewhere (the icon neither)


def test_only_the_controls_that_apply_show(browser: Browser, page_url: str) -> None:
    page, failed = _open(browser, page_url, DESKTOP)
    expect(page.locator("#beam")).to_be_hidden()  # greedy by default
    page.select_option("#decoding", "beam")
    expect(page.locator("#beam")).to_be_visible()
    expect(page.locator("#temperature")).to_be_hidden()
    page.select_option("#decoding", "sample")
    expect(page.locator("#temperature")).to_be_visible()
    expect(page.locator("#beam")).to_be_hidden()
    page.select_option("#model", "gpt")
    assert page.locator("#decoding option[value=beam]").is_disabled()
    assert page.locator("#positions-title").inner_text() == "Positions: RoPE (rotary)"
    page.select_option("#decoding", "greedy")
    expect(page.locator("#temperature")).to_be_hidden()
    page.select_option("#model", "bert")
    expect(page.locator("#decoding")).to_be_hidden()
    expect(page.locator("#max_tokens")).to_be_hidden()
    expect(page.locator("#go")).to_have_text("Embed")
    expect(page.locator("#pe")).to_have_attribute("src", "/positions.png?model=bert")
    page.wait_for_function("document.getElementById('pe').naturalWidth > 0")
    page.close()
    assert failed == []


def test_errors_clear_stale_views_and_read_clearly(browser: Browser, page_url: str) -> None:
    page, failed = _open(browser, page_url, DESKTOP)
    page.select_option("#model", "gpt")
    page.fill("#max_tokens", "4")
    _run(page, "a dog")
    expect(page.locator("#inside")).to_be_visible()
    page.fill("#text", "   ")
    page.click("#go")
    expect(page.locator("#status")).to_have_text("type a text first")
    expect(page.locator("#inside")).to_be_hidden()  # no attention of an earlier text
    _run(page, "a dog")
    page.fill("#max_tokens", "9999")  # over the server's limit: refused
    page.click("#go")
    expect(page.locator("#status")).to_have_text("failed")
    expect(page.locator("#result")).to_have_class("error")
    expect(page.locator("#inside")).to_be_hidden()
    assert _contrast(page, "#status", "header") >= 4.5  # WCAG AA (the red on navy was 1.69)
    assert _contrast(page, "#result", "#result") >= 4.5
    page.close()
    assert failed == ["400 " + page_url + "v1/completions"]


def test_a_phone_gets_a_page_that_fits_and_a_long_output_scrolls(
    browser: Browser,
    page_url: str,
) -> None:
    page, failed = _open(browser, page_url, PHONE)
    page.select_option("#model", "gpt")
    page.fill("#max_tokens", "512")
    _run(page, "ein hund läuft im park")
    expect(page.locator("#inside")).to_be_visible()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"]  # nothing wider than the phone: no sideways page
    result = page.locator("#result")
    assert result.evaluate("o => o.scrollHeight > o.clientHeight")  # 512 tokens, in a box
    assert result.evaluate("o => getComputedStyle(o).overflowY") == "auto"
    for figure in page.locator("#views figure").all():
        assert figure.bounding_box()["x"] + figure.bounding_box()["width"] <= PHONE["width"]
    # pictures keep a readable size and scroll in their frames rather than shrink to the phone:
    # the heat map's cells (63 a side) 12 px at least, the positions picture 720 px wide
    assert page.evaluate("document.getElementById('heat').width") >= 63 * 12
    page.wait_for_function("document.getElementById('pe').naturalWidth > 0")
    assert page.locator("#pe").bounding_box()["width"] == 720
    frame = page.locator("#positions .scroll")
    assert frame.evaluate("f => f.scrollWidth > f.clientWidth && f.clientWidth <= 390")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "serve_page_phone.png"), full_page=True)
    page.close()
    assert failed == []
