"""C kernels built at run time: a build is kept under a name of its own and reused."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from attnkit.kernels import few_rows, loader


@pytest.mark.skipif(not shutil.which(os.environ.get("CC", "cc")), reason="no C compiler")
def test_a_build_is_kept_and_reused(tmp_path: Path) -> None:
    compiler = os.environ.get("CC", "cc")
    library = loader.build(few_rows.SOURCE, few_rows.FLAGS, compiler, tmp_path)
    built_at = library.stat().st_mtime_ns
    assert loader.build(few_rows.SOURCE, few_rows.FLAGS, compiler, tmp_path) == library
    assert library.stat().st_mtime_ns == built_at
    assert [p.name for p in tmp_path.iterdir()] == [library.name]  # no partial file left
    other = loader.build(few_rows.SOURCE, loader.BASE_FLAGS, compiler, tmp_path)
    assert other != library  # other flags, another library


def test_a_failed_build_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    monkeypatch.setenv("CC", "false")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert loader.load(few_rows.SOURCE, few_rows.FLAGS, "it runs slower") is None
    assert "few_rows.c was not built, it runs slower: false failed" in caplog.text
