"""The machine's limit: matmul GFLOP/s on each path torch has on this CPU.

A (M x K) @ (K x N) product is 2 M N K floating-point operations. Measured on
square 2048 matrices, the size where every path reaches its plateau:
- float32 through torch's default BLAS (MKL on x86),
- float32 through oneDNN (`torch.ops.mkldnn._linear_pointwise`, exact float32),
- bfloat16 (oneDNN, with the CPU's bf16 dot-product instructions when present).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

N = 2048


def _gflops(fn: Callable[[], torch.Tensor], reps: int = 10) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return 2 * N**3 * reps / (time.perf_counter() - start) / 1e9


def matmul_peaks(repeats: int = 5) -> dict[str, float]:
    """Best of `repeats` measurements of each path, in GFLOP/s."""
    a, b = torch.randn(N, N), torch.randn(N, N)
    a16, b16 = a.bfloat16(), b.bfloat16()
    paths = {"float32 BLAS": lambda: a @ b, "bfloat16": lambda: a16 @ b16}
    if torch.backends.mkldnn.is_available():
        linear = torch.ops.mkldnn._linear_pointwise
        paths["float32 oneDNN"] = lambda: linear(a, b, None, "none", [], "")
    with torch.no_grad():
        return {name: max(_gflops(fn) for _ in range(repeats)) for name, fn in paths.items()}


if __name__ == "__main__":
    torch.set_num_threads(2)
    for name, value in matmul_peaks().items():
        print(f"{name:>16}: {value:7.1f} GFLOP/s")
