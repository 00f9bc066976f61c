"""A decoder's matrix products with few rows: `F.linear`, the weight's halves, the C kernel.

The matrices are those of one decoding step of the GPT-2-shaped benchmark
model (6 layers, d_model 512, d_ff 2048, vocab 8,000): each row count runs
all 25 products, the paths alternating over repetitions after a warm-up;
medians are reported, with the speed-up of attnkit's two inference paths over
`F.linear`: the product over the weight's halves (a view of the weight) and
the few-row C kernel (`attnkit/nn/few_rows.c`). This is what sets
`attnkit.nn.linear.FEW_ROWS` and `KERNEL_ROWS`.

    PYTHONPATH=src python bench/bench_linear.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnkit.nn import Linear, few_rows

SHAPES = [(1536, 512), (512, 512), (2048, 512), (512, 2048)] * 6 + [(8000, 512)]


def seconds(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    args = parser.parse_args()
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
    header = f"{'F.linear ms':>12} {'halves ms':>10} {'kernel ms':>10} {'speed-ups':>12}"
    print(f"{'rows':>5} {header}")
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
            order = [("mkl", mkl), ("halves", halves), ("kernel", kernel)]
            for _, fn in order:
                fn()
            times: dict[str, list[float]] = {name: [] for name, _ in order}
            for rep in range(args.reps):
                for name, fn in order if rep % 2 == 0 else order[::-1]:
                    times[name].append(seconds(fn, calls))
            a, b, c = (statistics.median(times[name]) * 1000 for name, _ in order)
            print(f"{rows:>5} {a:>12.2f} {b:>10.2f} {c:>10.2f} {a / b:>5.2f}x {a / c:>5.2f}x")


if __name__ == "__main__":
    main()
