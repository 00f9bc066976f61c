"""A decoder's matrix products with few rows: `F.linear`, oneDNN's packed weight, two halves.

The matrices are those of one decoding step of the GPT-2-shaped benchmark
model (6 layers, d_model 512, d_ff 2048, vocab 8,000): each row count runs
all 25 products, the paths alternating over repetitions after a warm-up;
medians are reported, with the speed-up of oneDNN's packed weight (an extra
copy of the weight in oneDNN's blocked layout) and of attnkit's halves (a view
of the weight) over `F.linear`. This is what sets `attnkit.nn.linear.FEW_ROWS`.

    PYTHONPATH=src python bench/bench_linear.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnkit.nn import Linear

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
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]
    # attnkit's own layer, so its path over the weight's halves is measured as it ships.
    layers = [Linear(w.shape[1], w.shape[0]) for w in weights]
    for layer, w, b in zip(layers, weights, biases, strict=True):
        layer.weight.data.copy_(w)
        layer.bias.data.copy_(b)
    header = f"{'F.linear ms':>12} {'oneDNN ms':>10} {'halves ms':>14} {'speed-ups':>12}"
    print(f"{'rows':>5} {header}")
    with torch.no_grad():
        for rows in args.rows:
            inputs = {d: torch.randn(rows, d) for d in (512, 2048)}

            def mkl(inputs=inputs) -> None:
                for w, b in zip(weights, biases, strict=True):
                    F.linear(inputs[w.shape[1]], w, b)

            def onednn(inputs=inputs) -> None:
                for w, p, b in zip(weights, packed, biases, strict=True):
                    torch.ops.mkldnn._linear_pointwise(inputs[w.shape[1]], p, b, "none", [], "")

            def halves(inputs=inputs) -> None:
                for layer in layers:
                    layer._halves_product(inputs[layer.in_features])

            calls = max(2, 64 // rows)
            order = [("mkl", mkl), ("onednn", onednn), ("halves", halves)]
            for _, fn in order:
                fn()
            times: dict[str, list[float]] = {name: [] for name, _ in order}
            for rep in range(args.reps):
                for name, fn in order if rep % 2 == 0 else order[::-1]:
                    times[name].append(seconds(fn, calls))
            a, b, c = (statistics.median(times[name]) * 1000 for name, _ in order)
            print(f"{rows:>5} {a:>12.2f} {b:>10.2f} {c:>14.2f} {a / b:>5.2f}x {a / c:>5.2f}x")


if __name__ == "__main__":
    main()
