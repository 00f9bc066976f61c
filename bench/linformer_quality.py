"""Linformer's quality against full attention at equal steps: a masked LM on Tiny Shakespeare.

Tiny Shakespeare cut into passages of `--length` characters (newlines as spaces), each one
example of a character-level BERT-style encoder (2 layers, d_model 128 in 4 heads, 15% of
characters masked), trained for `--steps` steps with the same seed and batches: full
attention, then Linformer (`nn/linformer.py`) at each `--k`. The masked-LM validation loss at
the end (the held-out last 10% of passages) says what projecting the keys and values to k
rows costs in quality; the time is each run's, side by side on one machine.

    python -m bench linformer-quality [--steps 400] [--length 512] [--k 32 128]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

from attnkit.data.corpora import corpus_files
from attnkit.files import read_lines
from attnkit.run import RunFolder
from attnkit.train.run_config import RunConfig
from attnkit.train.tasks import train as train_run
from bench.harness import opening


def passages(out: Path, length: int, data_dir: str | None) -> Path:
    """Tiny Shakespeare as one passage of length - 2 characters a line (<s> and </s> fill the
    rest of `length`)."""
    text = " ".join(read_lines(corpus_files("tinyshakespeare", "train", data_dir=data_dir)[0]))
    size = length - 2
    lines = [text[i : i + size] for i in range(0, len(text) - size + 1, size)]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def train(corpus: Path, out: Path, args: argparse.Namespace, k: int | None) -> dict[str, float]:
    model = {"preset": "bert-mini", "d_model": 128, "n_heads": 4, "d_ff": 512}
    model |= {"n_encoder_layers": 2, "max_len": args.length, "dropout": 0.0}
    if k is not None:
        model |= {"attention_kind": "linformer", "linformer_k": k}
    config = RunConfig.from_dict(
        {
            "model": model,
            "data": {
                "task": "masked-lm",
                "corpus": str(corpus),
                "tokenizer": "char",
                "vocab_size": 100,
                "max_len": args.length,
                "max_tokens": args.length * args.batch,
            },
            "train": {
                "out_dir": str(out),
                "steps": args.steps,
                "lr": 1e-3,
                "warmup": args.steps // 10,
                "schedule": "linear",
                "threads": args.threads,
                "save_every": args.steps,
                "log_every": 100,
            },
            "eval": {"every": args.steps, "metric": "val_loss"},
        }
    )
    start = time.perf_counter()
    train_run(config)
    seconds = time.perf_counter() - start
    records = RunFolder(out).read_metrics()
    return {"val_loss": [r["val_loss"] for r in records if "val_loss" in r][-1], "s": seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench linformer-quality", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--length", type=int, default=512, help="characters a passage")
    parser.add_argument("--batch", type=int, default=16, help="passages a batch")
    parser.add_argument("--k", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-dir", default="../shared/data")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    opening(
        f"{args.threads} threads, {args.steps} steps, passages of {args.length} characters, "
        f"batches of {args.batch}"
    )
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = passages(Path(tmp) / "passages.txt", args.length, args.data_dir)
        rows["full attention"] = train(corpus, Path(tmp) / "full", args, None)
        for k in args.k:
            rows[f"Linformer, k = {k}"] = train(corpus, Path(tmp) / f"k{k}", args, k)
    print(f"\n| attention | masked-LM val loss after {args.steps} steps | training time |")
    print("| --- | ---: | ---: |")
    for name, r in rows.items():
        print(f"| {name} | {r['val_loss']:.3f} | {r['s']:.0f} s |")


if __name__ == "__main__":
    main()
