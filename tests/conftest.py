"""Shared fixtures: the corpora in ../shared/data beside the repository root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """../shared/data beside the repository, or $ATTNKIT_TEST_DATA."""
    return Path(
        os.environ.get("ATTNKIT_TEST_DATA") or Path(__file__).parents[2] / "shared" / "data"
    )


@pytest.fixture
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty corpus cache, with no $ATTNKIT_DATA, so only what a test sets up is found."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ATTNKIT_CACHE", str(cache))
    monkeypatch.delenv("ATTNKIT_DATA", raising=False)
    return cache / "data"
