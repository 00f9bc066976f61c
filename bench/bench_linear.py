"""A decoder's matrix products with few rows: `F.linear`, the weight's halves, the C kernel.

The matrices are those of one decoding step of the GPT-2-shaped benchmark
model (6 layers, d_model 512, d_ff 2048, vocab 8,000): each row count runs
all 25 products, the paths alternating over repetitions after a warm-up;
medians are reported (microseconds for the 25), with the speed-up of
attnkit's two inference paths over `F.linear`: the product over the weight's
halves (a view of the weight) and the few-row C kernel
(`attnkit/nn/few_rows.c`). This is what sets `attnkit.nn.linear.FEW_ROWS`
and `KERNEL_ROWS`.

    python -m bench linear --threads 2
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from attnkit.nn import Linear, few_rows
from bench.harness import (
    Result,
    alternate,
    finish,
    markdown_row,
    opening,
    seconds_per_call,
)

SHAPES = [(1536, 512), (512, 512), (2048, 512), (512, 2048)] * 6 + [(8000, 512)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench linear", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    weights = [torch.randn(shape) * 0.02 for shape in SHAPES]
    biases = [torch.zeros(shape[0]) for shape in SHAPES]
    # attnkit's own layer, so its path over the weight's halves is measured as it ships.
    layers = [Linear(w.shape[1], w.shape[0]) for w in weights]
    for layer, w, b in zip(layers, weights, biases, strict=True):
        layer.weight.data.copy_(w)
        layer.bias.data.copy_(b)
    if not few_rows.available():
        raise SystemExit("the few-row kernel is not built on this machine (see the warning)")
    header = opening(f"{args.threads} threads, {args.reps} reps")
    results = []
    with torch.no_grad():
        for rows in args.rows:
            inputs = {d: torch.randn(rows, d) for d in (512, 2048)}

            def mkl(inputs=inputs) -> None:
                for w, b in zip(weights, biases, strict=True):
                    F.linear(inputs[w.shape[1]], w, b)

            def halves(inputs=inputs) -> None:
                for layer in layers:
                    layer._halves_product(inputs[layer.in_features])

            def kernel(inputs=inputs) -> None:
                for layer in layers:
                    few_rows.linear(inputs[layer.in_features], layer.weight, layer.bias)

            calls = max(2, 64 // rows)
            paths = (mkl, halves, kernel)
            for path in paths:  # the warm-up: one call each
                path()
            timed = (seconds_per_call(path, calls) for path in paths)
            seconds = alternate(*timed, reps=args.reps, warmup=0, swap=True)
            us = [[s * 1e6 for s in side] for side in seconds]
            for name, side in (("weight halves", us[1]), ("few-row kernel", us[2])):
                results.append(
                    Result(
                        f"{rows} rows, {name}",
                        "µs",
                        side,
                        us[0],
                        "F.linear",
                        higher_is_better=False,
                    )
                )
                print(markdown_row(results[-1]), flush=True)
    finish(results, header, args.out)


if __name__ == "__main__":
    main()
