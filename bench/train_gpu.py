"""Training tokens/s on a GPU: `attnkit train` against nanoGPT's loop, same recipe, same GPU.

The work is nanoGPT's Tiny Shakespeare GPU recipe (the recipe `tinyshakespeare_char_gpu`;
`bench/peers/nanogpt_train.py`'s `gpu` recipe): 6 layers, 6 heads, d_model 384, block
256, batch 64 (16,384 tokens a step), dropout 0.2, bf16 autocast, torch.compile and the
fused AdamW on both sides.

ours: `attnkit.train.tasks.train` on that config, as `attnkit train` runs it (its data
      pipeline, Trainer and objective), without evaluations;
peer: the loop of nanoGPT's train.py (batches cut at random offsets, pinned and copied
      without blocking, the loss read back every 10 iterations).

Each side trains `--steps` steps; the steps after `--warmup` (compilation) are timed in
windows of `--window` steps, each closed where the side waits for the GPU anyway (our
Trainer's logging steps, the peer's reads of its loss), and the median window gives the
tokens/s. `--profile DIR` also writes torch.profiler's tables of 10 steps of each side.

    python -m bench train --device cuda --data-dir ../shared/data [--steps 400] [--profile DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import torch

from attnkit import recipes
from attnkit.train.run_config import RunConfig
from attnkit.train.tasks import train
from bench.harness import Result, finish, opening
from bench.peers import nanogpt_train

CONFIG = recipes.path("tinyshakespeare_char_gpu")
RECIPE = nanogpt_train.RECIPES["gpu"]


class Clock:
    """Tokens/s over windows of steps, read at the steps where the side synchronises."""

    def __init__(self, warmup: int, window: int, profile: Path | None, side: str) -> None:
        self.warmup, self.window, self.profile, self.side = warmup, window, profile, side
        self.marks: list[tuple[int, float]] = []
        self.profiler: torch.profiler.profile | None = None

    def synced(self, step: int) -> None:
        """Called after `step` at a point where the host has waited for the GPU."""
        if step >= self.warmup and (step - self.warmup) % self.window == 0:
            self.marks.append((step, time.perf_counter()))

    def each_step(self, step: int) -> None:
        start = self.warmup + self.window // 2
        if self.profile is None or step not in (start, start + 10):
            return
        if step == start:
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.__enter__()
            return
        torch.cuda.synchronize()
        self.profiler.__exit__(None, None, None)
        averages = self.profiler.key_averages()
        self.profile.mkdir(parents=True, exist_ok=True)
        text = [
            averages.table(sort_by=key, row_limit=30)
            for key in ("cuda_time_total", "cpu_time_total")
        ]
        (self.profile / f"profile_{self.side}.txt").write_text("\n\n".join(text))

    def tokens_per_s(self) -> list[float]:
        pairs = zip(self.marks, self.marks[1:], strict=False)
        return [RECIPE.tokens * (b[0] - a[0]) / (b[1] - a[1]) for a, b in pairs]


def ours(args: argparse.Namespace, mode: str) -> list[float]:
    clock = Clock(args.warmup, args.window, args.profile, f"attnkit_{mode}")

    def callback(info: dict) -> None:
        clock.each_step(info["step"])
        if "loss" in info:  # a logging step: the Trainer has read the loss back
            clock.synced(info["step"])

    with tempfile.TemporaryDirectory() as out:
        overrides = [
            f"data.data_dir={args.data_dir}",
            f"train.out_dir={out}/run",
            f"train.steps={args.steps}",
            f"train.log_every={args.window}",
            f"train.save_every={args.steps}",
            f"eval.every={args.steps}",
            "eval.max_batches=1",
            f"train.device={args.device}",
            f"train.compile_mode={mode}",
        ]
        if args.device == "cpu":  # a dry run of the benchmark itself, small and plain
            overrides += ["train.compile=false", "train.precision=fp32", "data.batch_size=4"]
        train(RunConfig.load(CONFIG, overrides), callbacks=[callback])
    return clock.tokens_per_s()


def peer(args: argparse.Namespace) -> list[float]:
    clock = Clock(args.warmup, args.window, args.profile, "peer")
    recipe = RECIPE
    if args.device == "cpu":  # a dry run of the benchmark itself, small and plain
        recipe = dataclasses.replace(recipe, device="cpu", fast=False, batch=4)
    torch.manual_seed(1337)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        vocab = nanogpt_train.encode(args.data_dir / "tinyshakespeare" / "input.txt", out)
        model, optimizer = nanogpt_train.build(vocab, recipe)
        if args.window % recipe.log_interval:  # its windows close only where it reads back
            raise SystemExit(f"--window must be a multiple of {recipe.log_interval}")
        loop = nanogpt_train.iterations(model, optimizer, out, recipe, args.steps)
        for step, loss in loop:  # step: nanoGPT's iter_num, the iteration just done
            clock.each_step(step)
            if loss is not None:
                clock.synced(step)
    return clock.tokens_per_s()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench train --device cuda", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--device", default="cuda", help="cuda; cpu only tries the benchmark out")
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--window", type=int, default=50)
    parser.add_argument("--profile", type=Path, default=None, help="write profiler tables here")
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["auto"],
        help="train.compile_mode of our side, each measured (auto: CUDA graphs on a GPU)",
    )
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    if args.device != "cpu" and not torch.cuda.is_available():
        raise SystemExit("python -m bench train --device cuda needs a CUDA device")
    # The peer, as nanoGPT, lets float32 products use TF32; attnkit train does the same on CUDA.
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    header = opening(f"torch {torch.__version__}", f"{args.steps} steps, windows of {args.window}")
    theirs = peer(args)
    results = []
    for mode in args.modes:
        mine = ours(args, mode)
        results.append(
            Result(
                f"nanoGPT Shakespeare-char GPU recipe, bf16 + compile ({mode})",
                "tokens/s",
                mine,
                theirs,
                "nanoGPT-style loop",
            )
        )
        print(
            f"windows: ours ({mode}) {[round(t) for t in mine]}, peer {[round(t) for t in theirs]}"
        )
    finish(results, header, args.out)


if __name__ == "__main__":
    main()
