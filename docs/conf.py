"""Sphinx's settings for attnkit's documentation: MyST Markdown pages, executed course pages.

Build it as the test does (tests/test_docs.py), warnings as errors:

    python -m sphinx -W --keep-going -b html docs docs/_build/html

The course pages (learn/) are notebooks in MyST Markdown that myst-nb runs at build time,
drawing their pictures then; their outputs are cached by jupyter-cache beside the build
(`docs/_build/.jupyter_cache`) and rerun when a page's code changes. After a change to the
library, build afresh (remove docs/_build) to run them all again: the test always does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "_ext"))  # the reference generated from the code

import attnkit  # noqa: E402 (after the path above)

project = "attnkit"
author = "the attnkit authors"
copyright = "the attnkit authors"
release = version = attnkit.__version__

extensions = [
    "myst_nb",  # MyST Markdown, and pages that run their code (the course)
    "sphinx.ext.autodoc",  # the Python API, from the docstrings
    "sphinxarg.ext",  # every command and option, from the argparse parsers
    "attnkit_reference",  # every run-config key and the run folder's files, from the code
]
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
root_doc = "index"

# MyST: $...$ maths in the course, ::: fences, and anchors for ## headings, which pages link to.
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# The course runs at build time; a cell that raises fails the build, as does a slow one. Each
# page's kernel takes one thread: the build runs pages side by side (-j), and the models are tiny.
os.environ.setdefault("OMP_NUM_THREADS", "1")
nb_execution_mode = "cache"
# Where executed pages are cached; the docs test names a folder per state of the library, so
# that a cached output is never one that older code computed.
nb_execution_cache_path = os.environ.get("ATTNKIT_DOCS_CACHE", "")
nb_execution_in_temp = True  # what a page writes (pictures, run folders) stays out of docs/
nb_execution_timeout = 120
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True

# Docstrings write code as `name`, which reads as code in the rendered API too.
default_role = "literal"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}

html_theme = "furo"
html_title = f"attnkit {version}"
html_static_path = ["_static"]
html_css_files = ["attnkit.css"]  # wide tables scroll within the page; see the file

# MathJax is served from the site itself, not a CDN, so the course's formulas read offline. Its
# files come from the PyPI package sphinx-mathjax-offline (MathJax 3, the [docs] extra); only
# what TeX in HTML-CSS needs is copied (the loader, its fonts, the TeX extensions and the
# menu), not the package's 24 MB of other bundles and speech rules.
MATHJAX_FILES = ("tex-chtml.js", "output/chtml", "input/tex", "ui", "a11y")
mathjax_path = "mathjax/tex-chtml.js"  # under _static
html_theme_options = {"navigation_with_keys": True}

# Quotes and ellipses typeset, but not dashes: `--help` and `--set` stay as typed.
smartquotes_action = "qe"


def _open_execution_cache(app) -> None:
    """Create the jupyter-cache database before the pages are read: with `-j`, two reader
    processes would otherwise both create it, and one of them fails."""
    from jupyter_cache import get_cache

    get_cache(app.env.mystnb_config.execution_cache_path).db  # noqa: B018 (opening creates it)


def mathjax_folder() -> Path:
    """The MathJax of the package sphinx-mathjax-offline (its import name has hyphens, so it
    is found by its distribution's files)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        found = distribution("sphinx-mathjax-offline")
    except PackageNotFoundError:
        raise RuntimeError(
            "the docs serve MathJax from the site: pip install -e '.[docs]' (or "
            "sphinx-mathjax-offline) first"
        ) from None
    return Path(found.locate_file("sphinx-mathjax-offline/static/mathjax"))


def _copy_mathjax(app, error) -> None:
    """Copy MathJax's files into the built site's _static/mathjax, where `mathjax_path` points."""
    if error is not None or app.builder.format != "html":
        return
    from sphinx.util.fileutil import copy_asset

    source, target = mathjax_folder(), Path(app.outdir) / "_static" / "mathjax"
    for name in MATHJAX_FILES:
        if (source / name).is_dir():
            copy_asset(str(source / name), str(target / name))
        else:
            target.mkdir(parents=True, exist_ok=True)
            copy_asset(str(source / name), str(target))


def setup(app) -> None:
    app.connect("builder-inited", _open_execution_cache, priority=900)  # after myst-nb's own
    app.connect("builder-inited", lambda app: mathjax_folder())  # missing: said at once
    app.connect("build-finished", _copy_mathjax)
