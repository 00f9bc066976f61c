"""Shared test settings and fixtures: deterministic small runs, corpora, run folders.

The corpora: `samples`, a few hundred lines shipped in tests/samples/, for most tests; and
`data_dir`, the whole corpora, found as the library finds them (../shared/data beside the
repository where it exists, $ATTNKIT_DATA, the cache, else a download). The run folders are
built by `tests.helpers`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.helpers import SAMPLES, gpt2_folder, tiny_g2p_run, tiny_run, whole_corpora


def pytest_configure() -> None:
    # Tiny models gain nothing from threads; one thread keeps runs steady on a shared machine,
    # and the cores go to pytest-xdist's workers instead.
    torch.set_num_threads(1)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: `-p no:xdist` runs without it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: $PYTEST_XDIST_AUTO_NUM_WORKERS if set, else a worker for each core this
    process may use, at most 4. Some tests start processes of their own (torchrun's ranks,
    servers, a browser, the docs' kernels), so more workers than cores would slow them all;
    the cap is what was measured (2 cores) plus room."""
    if chosen := os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(chosen)
    if hasattr(os, "sched_getaffinity"):  # Linux: the cores this process may run on
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


# The documentation's build, with its course pages, is the longest fixture (about 2 minutes):
# started first, it runs beside the other files rather than on one worker after them.
LONGEST_FIRST = ("test_docs.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)  # stable: else as found


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of the whole known corpora, `<corpus>/<file>`: those in ../shared/data beside
    the repository where it exists, else in $ATTNKIT_DATA or the cache, else downloaded into the
    cache (`tests.helpers.whole_corpora`). Only for tests that need a whole corpus."""
    return whole_corpora(tmp_path_factory.mktemp("corpora"))


@pytest.fixture(scope="session")
def samples() -> Path:
    """A folder of small cuts of the corpora, `<corpus>/<file>` (tests/samples/README.md)."""
    return SAMPLES


@pytest.fixture
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty corpus cache, with no $ATTNKIT_DATA, so only what a test sets up is found."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ATTNKIT_CACHE", str(cache))
    monkeypatch.delenv("ATTNKIT_DATA", raising=False)
    return cache / "data"


@pytest.fixture(scope="module")
def mt_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A translation run folder (`tiny_run`), one for each test module that asks."""
    return tiny_run(tmp_path_factory.mktemp("mt"), "encoder-decoder")


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A language-model run folder (`tiny_run`), one for each test module that asks."""
    return tiny_run(tmp_path_factory.mktemp("lm"), "decoder")


@pytest.fixture(scope="module")
def g2p_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A grapheme-to-phoneme run folder (`tests.helpers.tiny_g2p_run`), one for each test module."""
    return tiny_g2p_run(tmp_path_factory.mktemp("g2p"))


@pytest.fixture
def hf_folder(tmp_path: Path) -> Path:
    """A tiny GPT-2 Hugging Face folder with a tokenizer (`tests.helpers.gpt2_folder`)."""
    return gpt2_folder(tmp_path / "hf")
