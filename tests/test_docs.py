"""The documentation: it builds with warnings as errors (every internal link resolving, every
course page running its code), its pages render in a browser, and its examples run as written.

The build is the one the docs' own instructions give (`python -m sphinx -W ...`). The course
pages' outputs are cached in a folder named by a hash of the library and the docs, so a rerun
with neither changed reuses them, and any change to either runs them all again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from attnkit import recipes
from tests.helpers import ARTIFACTS, BROWSER_FLAGS, CHROMIUM

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
# The docs' extension (beside conf.py), loaded from its file rather than put on sys.path; it
# is registered first, as its dataclasses look their module up there.
_EXTENSION = DOCS / "_ext" / "attnkit_reference.py"
_spec = importlib.util.spec_from_file_location("attnkit_reference", _EXTENSION)
attnkit_reference = sys.modules["attnkit_reference"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(attnkit_reference)

# What the executed pages' outputs depend on: the package and the pages themselves.
INPUTS = ("src/attnkit/**/*.py", "src/attnkit/**/*.toml", "src/attnkit/**/*.c", "docs/**/*.md",
          "docs/**/*.py", "bench/results/*.json")  # fmt: skip


# What the kernels running the course pages log about themselves rather than about a page: the
# kernel's own start-up notes, and tornado's report of a message that reached a kernel's socket
# as it shut down (seen once in CI, on a build whose every cell ran). A cell that fails still
# fails the build, as conf.py sets `nb_execution_raise_on_error`.
KERNEL_CHATTER = ("[IPKernelApp]", "tornado.general:Uncaught exception in ZMQStream callback")


def sources_hash() -> str:
    digest = hashlib.sha256()
    for pattern in INPUTS:
        for path in sorted(ROOT.glob(pattern)):
            if "_build" not in path.parts:
                digest.update(str(path.relative_to(ROOT)).encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)


def executed(page: Path) -> bool:
    return "file_format: mystnb" in page.read_text().split("\n---", 1)[0]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "html"
    env = {**os.environ, "ATTNKIT_DOCS_CACHE": str(DOCS / "_build" / "cache" / sources_hash())}
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-j", "2",
               "-b", "html", str(DOCS), str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1200)
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    warnings = [w for w in warnings if not any(chatter in w for chatter in KERNEL_CHATTER)]
    assert done.returncode == 0 and not warnings, "\n".join(warnings) + "\n" + done.stderr[-3000:]
    return out


def test_the_docs_build_with_warnings_as_errors_into_every_section(site: Path) -> None:
    built = {p.relative_to(site).with_suffix("") for p in site.rglob("*.html")}
    for page in pages():
        assert page.relative_to(DOCS).with_suffix("") in built, page
    for folder in ("get-started", "learn", "howto", "reference", "results", "explanation"):
        assert list((site / folder).glob("*.html")), folder
    home = (site / "index.html").read_text()
    for folder in ("howto", "results", "explanation"):  # the globs that take others' pages
        for page in (DOCS / folder).glob("*.md"):
            assert f'href="{folder}/{page.stem}.html"' in home, page


def test_the_course_runs_its_code_and_draws_its_pictures(site: Path) -> None:
    course = sorted(p for p in (DOCS / "learn").glob("*.md") if executed(p))
    assert len(course) == 11
    for page in course:
        html = (site / "learn" / f"{page.stem}.html").read_text()
        assert "cell_output" in html, page  # its code ran and printed
    drawn = [p for p in course if "<img" in (site / "learn" / f"{p.stem}.html").read_text()]
    assert len(drawn) >= 9


def test_every_figure_is_drawn_and_captioned(site: Path) -> None:
    for page in pages():
        text = page.read_text()
        html = (site / page.relative_to(DOCS).with_suffix(".html")).read_text()
        article = html[html.index("<article") : html.index("</article>")]
        figures = re.findall(r"<figure\b.*?</figure>", article, re.S)
        # A picture in Markdown (![...]) has no caption; a course cell's is `mystnb: figure`.
        asked = len(re.findall(r"^```\{figure\}|^  figure:$", text, re.M))
        assert not re.search(r"^!\[", text, re.M), f"{page}: give the picture a {{figure}} caption"
        assert len(figures) == asked, page  # each drawn: a cell that draws nothing has none
        for figure in figures:
            assert "<img" in figure and "<figcaption" in figure, page


def test_the_reference_is_generated_from_the_code(site: Path) -> None:
    cli = (site / "reference" / "cli.html").read_text()
    for command in ("demo", "train", "recipes", "translate", "generate", "eval", "embed", "serve"):
        assert f'id="{command}"' in cli or f">{command}<" in cli, command
    config = (site / "reference" / "run-config.html").read_text()
    for section, _ in attnkit_reference.sections():
        for key in attnkit_reference.section_keys(section):
            assert f"{section}.{key.name}</span>" in config, (section, key.name)
    api = (site / "reference" / "api.html").read_text()
    for name in ("ModelConfig", "build_model", "Tokenizer", "from_pretrained", "AttnkitError"):
        assert f'id="attnkit.{name}"' in api, name


def test_the_site_renders_in_a_browser(site: Path) -> None:
    assert Path(CHROMIUM).is_file(), "Chromium is missing: apt-get install chromium"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shots = {
        "index.html": ("docs_home.png", "Learn the Transformer with attnkit"),
        "learn/attention.html": ("docs_course_attention.png", "A worked example with four tokens"),
        "reference/run-config.html": ("docs_reference_run_config.png", "train.device"),
    }
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        for path, (picture, text) in shots.items():
            page.goto((site / path).as_uri())
            assert text in page.inner_text("body"), path
            images = page.eval_on_selector_all(
                "article img", "imgs => imgs.map(i => i.complete && i.naturalWidth > 0)"
            )
            assert all(images), path  # every picture of the page loaded
            if path.startswith("learn/"):
                assert len(images) >= 2  # the masks and the heads
                page.locator("article img").first.scroll_into_view_if_needed()  # in the shot
            page.screenshot(path=str(ARTIFACTS / picture))
        browser.close()


# A script or stylesheet that a page loads from another host: offline, the page lacks it.
REMOTE_ASSET = re.compile(r"<(?:script|link)\b[^>]*\b(?:src|href)=\"(?:https?:)?//[^\"]+\"")


def test_the_site_reads_offline_its_formulas_typeset_by_its_own_mathjax(site: Path) -> None:
    for page in site.rglob("*.html"):
        assert not REMOTE_ASSET.findall(page.read_text()), page  # no CDN: MathJax included
    course = (site / "learn" / "attention.html").read_text()
    assert 'src="../_static/mathjax/tex-chtml.js' in course
    fonts = site / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2"
    assert len(list(fonts.glob("*.woff"))) > 10
    with sync_playwright() as p:  # typeset in a browser that may reach no other host
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        asked: list[str] = []
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(
            "file:") else (asked.append(route.request.url), route.abort()))  # fmt: skip
        page.goto((site / "learn" / "attention.html").as_uri())
        page.wait_for_selector("mjx-container", timeout=30_000)
        typeset = page.eval_on_selector_all("mjx-container", "m => m.length")
        raw = page.inner_text("article").count("\\sqrt")
        browser.close()
    assert typeset >= 3 and raw == 0 and not asked, (typeset, raw, asked)


def test_no_table_is_cut_at_a_laptops_width(site: Path) -> None:
    """At 1280 px every table shows its last column (the reference's "what it does", the
    results' commands) without scrolling sideways (docs/_static/attnkit.css)."""
    cut = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        for source in pages():
            page.goto((site / source.relative_to(DOCS).with_suffix(".html")).as_uri())
            widths = page.eval_on_selector_all(
                "article table", "ts => ts.map(t => [t.parentElement.scrollWidth, "
                "t.parentElement.clientWidth])",
            )  # fmt: skip
            if over := [w for w in widths if w[0] > w[1] + 1]:
                cut[str(source.relative_to(DOCS))] = over
        browser.close()
    assert not cut, cut  # (table's width, room) of each table that does not fit


def test_the_sidebar_lists_guides_and_results_in_a_readers_order(site: Path) -> None:
    home = (site / "index.html").read_text()
    sidebar = home[home.index("sidebar-tree") :]

    def order(folder: str) -> list[str]:
        return list(dict.fromkeys(re.findall(rf'href="{folder}/([\w-]+)\.html"', sidebar)))

    howto, results = order("howto"), order("results")
    assert howto[:3] == ["recipes", "your-own-data", "runs-from-python"], howto
    assert results[0] == "real-data", results


def test_every_run_config_key_has_its_sentence() -> None:
    missing = [
        f"{section}.{key.name}"
        for section, _ in attnkit_reference.sections()
        for key in attnkit_reference.section_keys(section)
        if not key.sentence
    ]
    assert not missing, f"add a `name: ...` entry to the section's docstring for {missing}"


def test_the_run_folder_table_keeps_each_descriptions_wrapped_lines() -> None:
    rows = dict(attnkit_reference.run_folder_files())
    assert set(rows) >= {"config.json", "checkpoints/best/", "wandb/"}
    assert rows["model.safetensors"].endswith("binds them to their tokenizer's fingerprint")
    assert rows["checkpoints/step-0000500/sharded/"].endswith("in one slice per rank")


def test_the_choices_of_a_key_are_the_ones_its_check_accepts() -> None:
    keys = {k.name: k for k in attnkit_reference.section_keys("train")}
    assert keys["schedule"].allowed == ("inverse-sqrt", "cosine", "linear", "constant")
    assert keys["device"].allowed == ()  # any torch device: no list to offer
    model = {k.name: k for k in attnkit_reference.section_keys("model")}
    assert "swiglu" in model["activation"].allowed and "switch" in model["router"].allowed


def python_blocks(text: str) -> list[str]:
    """The ```python blocks of a Markdown text that claim to run: all but those whose first
    line says what they need (`# needs a run folder ...`)."""
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    return [b for b in blocks if not b.startswith("# needs ")]


@pytest.mark.parametrize(
    "page",
    [ROOT / "README.md", *(p for p in pages() if not executed(p) and python_blocks(p.read_text()))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_python_examples_run_as_written(page: Path, tmp_path: Path) -> None:
    code = "\n".join(python_blocks(page.read_text()))  # a page's blocks, in one session
    assert code.strip(), f"{page} shows no Python that runs"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_recipes_page_has_a_section_for_every_recipe() -> None:
    text = (DOCS / "howto" / "recipes.md").read_text()
    headings = {n for line in re.findall(r"^## (.+)$", text, re.M) for n in line.split(", ")}
    assert headings == set(recipes.names())


def asks_a_server(page: Path) -> bool:
    text = page.read_text()
    return "attnkit serve " in text and ('"model": "' in text or 'model="' in text)


@pytest.mark.parametrize(
    "page",
    [p for p in [ROOT / "README.md", *pages()] if asks_a_server(p)],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_serving_examples_name_models_as_the_server_does(page: Path) -> None:
    text = page.read_text()
    commands = [line.split("#")[0].split() for line in re.findall(r"attnkit serve (.+)", text)]
    runs = [run for words in commands for run in words if "/" in run]  # RUN_DIR or NAME=RUN_DIR
    served = {run.split("=")[0] if "=" in run else Path(run).name for run in runs}
    asked = set(re.findall(r'"model": "([^"]+)"', text)) | set(re.findall(r'model="([^"]+)"', text))
    assert asked and asked <= served, (asked, served)
