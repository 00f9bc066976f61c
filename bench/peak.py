"""The machine's limit: matmul GFLOP/s on each path torch has on this CPU.

A (M x K) @ (K x N) product is 2 M N K floating-point operations. Measured on
square 2048 matrices, the size where every path reaches its plateau:
- float32 through torch's default BLAS (MKL on x86),
- float32 through oneDNN (`torch.ops.mkldnn._linear_pointwise`, exact float32),
- bfloat16 (oneDNN, with the CPU's bf16 dot-product instructions when present).

A CPU without bf16 instructions (AVX2 only) runs bfloat16 products through a
slow fallback, about 1 GFLOP/s, where one 2048 product takes many seconds; such
a path is measured on 512 matrices instead, which is enough to show it is no
limit worth reaching for.

    python -m bench peak --threads 2
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from bench.harness import opening

N = 2048
PROBE = 512
# A path slower than this at the probe size would take seconds per 2048 product.
SLOW_GFLOPS = 20.0

Matmul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _gflops(matmul: Matmul, n: int, dtype: torch.dtype, seconds: float = 0.3) -> float:
    """GFLOP/s of n x n products, timed over repeated calls lasting `seconds` after a warm-up."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    matmul(a, b)
    reps, start = 0, time.perf_counter()
    while reps == 0 or time.perf_counter() - start < seconds:
        matmul(a, b)
        reps += 1
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e9


def matmul_peaks(repeats: int = 3) -> dict[str, float]:
    """Best of `repeats` measurements of each path, in GFLOP/s."""
    paths: dict[str, tuple[torch.dtype, Matmul]] = {
        "float32 BLAS": (torch.float32, torch.matmul),
        "bfloat16": (torch.bfloat16, torch.matmul),
    }
    if torch.backends.mkldnn.is_available():
        linear = torch.ops.mkldnn._linear_pointwise
        paths["float32 oneDNN"] = (torch.float32, lambda a, b: linear(a, b, None, "none", [], ""))
    peaks = {}
    with torch.no_grad():
        for name, (dtype, matmul) in paths.items():
            n = N if _gflops(matmul, PROBE, dtype) > SLOW_GFLOPS else PROBE
            peaks[name] = max(_gflops(matmul, n, dtype) for _ in range(repeats))
    return peaks


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench peak", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    opening(f"{args.threads} threads")
    for name, value in matmul_peaks().items():
        print(f"{name:>16}: {value:7.1f} GFLOP/s")


if __name__ == "__main__":
    main()
