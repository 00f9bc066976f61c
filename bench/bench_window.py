"""Sliding-window attention block by block against the same window as a mask.

Forward and backward of causal self-attention, batch 4, 8 heads of 64, a
window of 256 keys, at growing lengths. Ours is `local_attention` (blocks of
the window, O(length x window)); the peer is `F.scaled_dot_product_attention`
with the window as a boolean mask, which costs full attention (attnkit's path
before the blocks, and the way a mask-based implementation computes a window).
Full causal attention (no window, SDPA's own causal kernel) is shown for scale.

    PYTHONPATH=src python -m bench.bench_window --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnkit.nn.attention import local_attention, local_mask, slot_distance
from bench.harness import Result, alternate, markdown_table


def forward_backward_ms(attend: Callable[[], torch.Tensor]) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        attend().sum().backward()
        return (time.perf_counter() - start) * 1e3

    return run


def measure(length: int, w: int, reps: int) -> Result:
    q, k, v = (torch.randn(4, 8, length, 64, requires_grad=True) for _ in range(3))
    mask = local_mask(slot_distance(length, length), w, causal=True)
    blockwise = forward_backward_ms(lambda: local_attention(q, k, v, w, causal=True))
    masked = forward_backward_ms(lambda: F.scaled_dot_product_attention(q, k, v, mask))
    full = forward_backward_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    ours, peer = alternate(blockwise, masked, reps=reps)
    full()  # warm-up
    return Result(
        f"window {w}, length {length}",
        "ms",
        ours,
        peer,
        "the window as a mask",
        higher_is_better=False,
        extra={"full causal attention, ms": statistics.median(full() for _ in range(reps))},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(markdown_table([measure(n, args.window, args.reps) for n in args.lengths]))


if __name__ == "__main__":
    main()
