"""C kernels built at run time: a build is kept under a name of its own and reused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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


def test_without_a_compiler_decoding_runs_in_pytorch_after_one_warning(lm_run, tmp_path):
    """No $CC program and no gcc on PATH, and an empty kernel cache: `generate` asks for more
    than one kernel, gets none, decodes in torch operations as it would with them, and says
    once what is slower."""
    command = [sys.executable, "-m", "attnkit", "generate", str(lm_run), "--prompt", "a dog",
               "--max-new-tokens", "12", "--greedy"]  # fmt: skip
    hidden = {"CC": str(tmp_path / "no-such-cc"), "PATH": str(Path(sys.executable).parent)}
    assert not shutil.which("gcc", path=hidden["PATH"])
    outputs = {}
    for name, env in (("hidden", hidden), ("built", {})):
        cache = {"XDG_CACHE_HOME": str(tmp_path / name)}
        done = subprocess.run(command, env={**os.environ, **env, **cache}, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr
        outputs[name] = done.stdout
        warnings = [line for line in done.stderr.splitlines() if "attnkit.kernels" in line]
        if name == "hidden":
            assert len(warnings) == 1 and "no C compiler" in warnings[0], done.stderr
            assert "decoding (the linear layers of a few rows" in warnings[0]
            assert "slower on a CPU, and word2vec and GloVe cannot train" in warnings[0]
            assert not (tmp_path / name / "attnkit").exists()  # nothing built
        else:
            assert warnings == [] and any((tmp_path / name / "attnkit").glob("*.so"))
    assert outputs["hidden"] == outputs["built"]
