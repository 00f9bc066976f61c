"""A decoder's matrix products with few rows: `F.linear` against oneDNN on a packed weight.

The matrices are those of one decoding step of the GPT-2-shaped benchmark
model (6 layers, d_model 512, d_ff 2048, vocab 8,000): each row count runs
all 25 products, the two paths alternating over repetitions after a warm-up;
medians are reported. This is what sets `attnkit.nn.linear.FEW_ROWS`.

    PYTHONPATH=src python bench/bench_linear.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

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
    print(f"{'rows':>5} {'F.linear ms':>12} {'oneDNN packed ms':>17} {'speed-up':>9}")
    with torch.no_grad():
        for rows in args.rows:
            inputs = {d: torch.randn(rows, d) for d in (512, 2048)}

            def mkl(inputs=inputs) -> None:
                for w, b in zip(weights, biases, strict=True):
                    F.linear(inputs[w.shape[1]], w, b)

            def onednn(inputs=inputs) -> None:
                for w, p, b in zip(weights, packed, biases, strict=True):
                    torch.ops.mkldnn._linear_pointwise(inputs[w.shape[1]], p, b, "none", [], "")

            calls = max(2, 64 // rows)
            mkl(), onednn()
            times: dict[str, list[float]] = {"mkl": [], "onednn": []}
            for rep in range(args.reps):
                order = [("mkl", mkl), ("onednn", onednn)]
                for name, fn in order if rep % 2 == 0 else order[::-1]:
                    times[name].append(seconds(fn, calls))
            a, b = (statistics.median(times[k]) * 1000 for k in ("mkl", "onednn"))
            print(f"{rows:>5} {a:>12.2f} {b:>17.2f} {a / b:>8.2f}x")


if __name__ == "__main__":
    main()
