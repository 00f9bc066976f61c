"""No library's exception reaches the user unexplained (issue 39, POOR: tracebacks from deep
inside a library): closed standard streams are named, and whatever no check foresaw still ends
in one sentence (exit 1), its traceback shown with --verbose."""

from __future__ import annotations

import errno
import os
import shlex
import subprocess
import sys

import pytest

from attnkit.cli import main
from attnkit.tokenizer import Tokenizer


@pytest.mark.parametrize(
    ("args", "closed", "sentence"),
    [
        (["translate", "{mt}", "--no-progress"], "stdin", "standard input is closed; give the"),
        (["translate", "{mt}", "--input", "{src}"], "stdout", "standard output is closed;"),
        (["generate", "{lm}", "--prompt", "a"], "stdout", "standard output is closed;"),
    ],
)
def test_a_closed_standard_stream_is_named(mt_run, lm_run, tmp_path, args, closed, sentence):
    source = tmp_path / "source.txt"
    source.write_text("ein hund\n")
    args = [a.format(mt=mt_run, lm=lm_run, src=source) for a in args]
    # Closed as the shell closes them, before Python starts (which then gives None).
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "attnkit", *args])
    redirect = "<&-" if closed == "stdin" else ">&-"
    done = subprocess.run(
        ["bash", "-c", f"{command} {redirect}"], stderr=subprocess.PIPE, text=True, check=False
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"attnkit: error: {sentence}")


class Unforeseen(RuntimeError):
    """An exception of a library's, raised where no check of attnkit's expects one."""

    __module__ = "safetensors"


def test_what_no_check_foresaw_ends_in_one_sentence(lm_run, monkeypatch, capsys):
    def fail(*_: object, **__: object) -> None:
        raise Unforeseen("header too large\nand a second line")

    monkeypatch.setattr(Tokenizer, "load", fail)
    assert main(["generate", str(lm_run), "--prompt", "a"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "attnkit: error: safetensors failed where attnkit did not expect it (Unforeseen: header "
        "too large); run again as attnkit --verbose ... for the traceback, and please report it"
    )
    with pytest.raises(Unforeseen):
        main(["--verbose", "generate", str(lm_run), "--prompt", "a"])


def test_a_full_disk_where_no_check_looked_is_one_sentence(lm_run, monkeypatch, capsys):
    """A full disk during `export onnx` was a traceback from inside torch (issue 39, POOR)."""

    def full(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/out/model.onnx")

    monkeypatch.setattr(Tokenizer, "load", full)
    assert main(["generate", str(lm_run), "--prompt", "a"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "attnkit: error: No space left on device (/out/model.onnx); the command stopped there"
    )


def test_ctrl_c_while_the_libraries_load_is_an_interrupt(monkeypatch, capsys):
    # The command line reaches `main` before torch loads (the package imports its names on
    # first use), and `main` takes a Ctrl-C during the heavy imports as any other.
    fresh = [sys.executable, "-c", "import sys, attnkit.cli; print('torch' in sys.modules)"]
    assert subprocess.run(fresh, capture_output=True, text=True, check=True).stdout == "False\n"

    def interrupted() -> None:
        raise KeyboardInterrupt

    module = sys.modules["attnkit.cli.main"]  # the module; `attnkit.cli.main` names the function
    monkeypatch.setattr(module, "build_parser", interrupted)
    assert main(["recipes"]) == 130
    assert capsys.readouterr().err == "attnkit: interrupted\n"
