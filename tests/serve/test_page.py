"""The page in a real browser: Chromium, driven by Playwright, loads it from a live server,
translates a sentence as it streams in, opens the attention view, switches layer and head,
and keeps a screenshot (under $ATTNKIT_TEST_ARTIFACTS, else test-artifacts/)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from attnkit.serve.app import create_app
from attnkit.serve.runs import served_runs
from tests.helpers import tiny_run
from tests.serve.live import serving

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking"]  # fmt: skip
ARTIFACTS = Path(
    os.environ.get("ATTNKIT_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts")
)


@pytest.fixture(scope="module")
def page_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("runs")
    runs = [str(tiny_run(tmp / "mt", "encoder-decoder")), str(tiny_run(tmp / "gpt", "decoder"))]
    with serving(create_app(served_runs(runs))) as address:
        yield address + "/"


def test_the_page_translates_and_shows_attention(page_url: str) -> None:
    assert Path(CHROMIUM).is_file(), "Chromium is missing: apt-get install chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        failed: list[str] = []
        page.on("requestfailed", lambda r: failed.append(r.url))
        page.on(
            "request", lambda r: failed.append(r.url) if not r.url.startswith(page_url) else None
        )
        page.goto(page_url)
        expect(page.locator("#model")).to_have_value("mt")
        expect(page.locator("#shape")).to_have_text("encoder-decoder")
        page.fill("#text", "ein hund läuft")
        page.select_option("#decoding", "greedy")
        page.fill("#max_tokens", "8")
        page.click("#go")
        expect(page.locator("#result")).to_have_attribute("data-done", "yes", timeout=30_000)
        expect(page.locator("#inside")).to_be_visible(timeout=30_000)
        assert page.locator("#kind option").all_inner_texts() == [
            "encoder self-attention", "decoder self-attention", "cross-attention",
        ]  # fmt: skip
        page.select_option("#kind", "cross")
        page.select_option("#layer", "0")
        page.select_option("#head", "1")
        assert page.locator("#lines line").count() > 0
        page.locator("#lines text").first.hover()  # the first query token: only its lines stay
        visible = page.locator("#lines line:visible")
        assert 0 < visible.count() < page.locator("#lines line").count()
        assert set(visible.evaluate_all("lines => lines.map(l => l.dataset.q)")) == {"0"}
        assert page.evaluate("document.getElementById('heat').width") > 100
        assert page.evaluate("document.getElementById('pe').naturalWidth") > 0
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "serve_page.png"), full_page=True)
        browser.close()
    assert failed == []  # nothing failed, nothing fetched from elsewhere
