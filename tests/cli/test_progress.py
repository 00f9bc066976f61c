"""Progress: a bar on a terminal, one log line every `train.log_every` steps elsewhere.

A bar written into a log file is hundreds of carriage-return updates in one line (the demo's
log was one 52 KB line); a log, a pipe or CI gets the training's log lines instead, one every
`train.log_every` steps and one at the last step, and no bar. `translate` and `eval` draw
their bar on a terminal only, too.
"""

import fcntl
import logging
import os
import pty
import struct
import subprocess
import sys
import termios
import threading

from attnkit.cli import main


def sets(out, steps: int, every: int) -> list[str]:
    pairs = [f"train.steps={steps}", f"train.log_every={every}", f"eval.every={steps}"]
    return [a for s in [*pairs, f"train.out_dir={out}"] for a in ("--set", s)]


def test_off_a_terminal_progress_is_one_log_line_every_n_steps(tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO, logger="attnkit")
    assert main(["train", "demo", *sets(tmp_path / "run", steps=45, every=10)]) == 0
    assert "\r" not in capsys.readouterr().err  # no bar was drawn into the captured stream
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [line.split()[1] for line in lines if "loss" in line] == [
        "10/45", "20/45", "30/45", "40/45", "45/45",
    ]  # fmt: skip


def test_the_demo_off_a_terminal_logs_its_progress_too(tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO, logger="attnkit")
    options = ["--steps", "100", "--eval-examples", "5", "--out", str(tmp_path / "demo")]
    assert main(["demo", *options]) == 0
    assert "\r" not in capsys.readouterr().err
    steps = [r.getMessage().split()[1] for r in caplog.records if "loss" in r.getMessage()]
    assert steps == ["50/100", "100/100"]  # the demo recipe's train.log_every is 50


def test_translate_off_a_terminal_draws_no_bar(tmp_path, capsys, mt_run):
    source = tmp_path / "in.txt"
    source.write_text("abc\n" * 80)  # more lines than the 64 below which no bar is drawn
    assert main(["translate", str(mt_run), "--input", str(source), "--max-new-tokens", "3"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 80
    assert "\r" not in captured.err and "translating" not in captured.err


def test_on_a_terminal_progress_is_a_bar(tmp_path):
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    command = [sys.executable, "-m", "attnkit", "train", "demo", *sets(tmp_path, 30, every=10)]
    proc = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=follower, env=os.environ
    )
    os.close(follower)
    chunks: list[bytes] = []

    def read() -> None:  # a pty's buffer is small: drain it while the run writes
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the child closed its end
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    out, _ = proc.communicate(timeout=300)
    reader.join(timeout=30)
    os.close(leader)
    screen = b"".join(chunks).decode()
    assert proc.returncode == 0, screen
    assert "training: 100%|" in screen and "30/30" in screen  # tqdm's bar, drawn to its end
    assert b"finished at step 30" in out
