"""Linformer's quality against full attention at equal steps: the Multi30k encoder.

The multi30k_de_en recipe made small (3+3 layers, d_model 128, d_ff 512) trains German->English
for `--steps` steps (a quarter of them warm-up, then the rate decays linearly to zero) with the
same seed and batches, once with full attention in the encoder and once with Linformer's
(`nn/linformer.py`) at each `--k` (0 is full attention). Multi30k's sentences are short (a
few dozen tokens at most), so only a small k compresses them. The table gives the validation
loss and greedy BLEU (`eval.decode_examples` sentences) at the end, and each run's time.

    python -m bench linformer-quality [--steps 300] [--k 0 16]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

from attnkit import recipes
from attnkit.run import RunFolder
from attnkit.train.run_config import RunConfig
from attnkit.train.tasks import train as train_run
from bench.harness import opening


def train(out: Path, args: argparse.Namespace, k: int) -> dict[str, float]:
    sets = ["model.d_model=128", "model.d_ff=512", f"train.steps={args.steps}"]
    sets += ["train.max_minutes=0", "train.decay_over=steps", f"train.threads={args.threads}"]
    sets += [f"train.out_dir={str(out)!r}", f"eval.every={args.steps}", "train.average_last=1"]
    sets += [f"train.save_every={args.steps}", f"data.data_dir={args.data_dir!r}"]
    sets += [f"train.warmup={args.steps // 4}"]
    if k:
        sets += ["model.attention_kind=linformer", f"model.linformer_k={k}"]
    start = time.perf_counter()
    train_run(RunConfig.load(recipes.path("multi30k_de_en"), sets))
    seconds = time.perf_counter() - start
    last = [r for r in RunFolder(out).read_metrics() if "val_loss" in r][-1]
    return {"val_loss": last["val_loss"], "bleu": last["bleu"], "s": seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench linformer-quality", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--k", type=int, nargs="+", default=[0, 16], help="0: full attention")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-dir", default="../shared/data")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    opening(f"{args.threads} threads, {args.steps} steps")
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in args.k:
            name = f"Linformer, k = {k}" if k else "full attention"
            rows[name] = train(Path(tmp) / f"k{k}", args, k)
    print(f"\n| encoder self-attention | val loss after {args.steps} steps |", end="")
    print(" val BLEU, greedy | training time |\n| --- | ---: | ---: | ---: |")
    for name, r in rows.items():
        print(f"| {name} | {r['val_loss']:.3f} | {r['bleu']:.2f} | {r['s']:.0f} s |")


if __name__ == "__main__":
    main()
