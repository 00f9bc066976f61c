"""The Tiny Shakespeare recipe end to end against a nanoGPT-style run of it, wall clock.

ours: `attnkit train tinyshakespeare_char` (nanoGPT's CPU recipe:
      4 layers, d_model 128, block 64, batch 12, 2,000 iterations);
peer: `python -m bench.peers.nanogpt_train`, the same recipe in the one-file
      loop that nanoGPT's users run (see that module).

Each run is a fresh process timed from launch to exit: imports, data,
training, evaluations, checkpoints, everything a user waits for. The sides
alternate, ours first in even repetitions and the peer first in odd ones, so a
steady drift of the machine's speed touches both alike; there is no warm-up
(a first run is what a user gets). Reported: the median seconds of each, the
ratio, and the last validation loss each printed (each side's own estimate
over 20 batches).

    python -m bench recipe --data-dir ../shared/data --reps 4
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnkit import recipes
from attnkit.run import RunFolder
from bench.harness import Result, alternate, finish, opening

CONFIG = recipes.path("tinyshakespeare_char")


def run(command: list[str]) -> tuple[float, str]:
    """Seconds from launch to exit, and what the command printed."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return seconds, done.stdout


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench recipe", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    header = opening(f"{args.reps} reps, {args.steps} steps")
    losses: dict[str, list[float]] = {"ours": [], "peer": []}

    def ours() -> float:
        out = Path(tempfile.mkdtemp()) / "run"  # a fresh run folder each time
        command = [sys.executable, "-m", "attnkit", "train", str(CONFIG)]
        command += ["--set", f"data.data_dir={args.data_dir}", "--set", f"train.out_dir={out}"]
        seconds, _ = run([*command, "--set", f"train.steps={args.steps}"])
        records = RunFolder(out).read_metrics()
        losses["ours"].append([r["val_loss"] for r in records if "val_loss" in r][-1])
        shutil.rmtree(out.parent)
        return seconds

    def peer() -> float:
        command = [sys.executable, "-m", "bench.peers.nanogpt_train", "--iters", str(args.steps)]
        command += ["--input", str(args.data_dir / "tinyshakespeare" / "input.txt")]
        seconds, printed = run(command)
        losses["peer"].append(float(printed.strip().splitlines()[-1].split()[-1]))
        return seconds

    # No warm-up: a first run is what a user gets.
    mine, theirs = alternate(ours, peer, reps=args.reps, warmup=0, swap=True)
    result = Result(
        "Tiny Shakespeare recipe, end to end",
        "seconds",
        mine,
        theirs,
        "nanoGPT-style loop",
        higher_is_better=False,
        extra={"val loss ours": losses["ours"][-1], "val loss peer": losses["peer"][-1]},
    )
    finish([result], header, args.out)
    print(f"seconds: ours {[round(s, 1) for s in mine]}, peer {[round(s, 1) for s in theirs]}")
    print(f"validation losses: ours {losses['ours']}, peer {losses['peer']}")


if __name__ == "__main__":
    main()
