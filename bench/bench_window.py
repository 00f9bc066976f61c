"""Sliding-window (and strided) attention block by block against the same pattern as a mask.

Forward and backward of causal self-attention, batch 4, 8 heads of 64, a
window of 256 keys (with `--stride`, also every stride-th key: the Sparse
Transformer's strided pattern), at growing lengths. Ours is `local_attention`
(blocks of the window, O(length x window), and columns of the stride,
O(length^2 / stride)); the peer is `F.scaled_dot_product_attention` with the
pattern as a boolean mask, which costs full attention (attnkit's path before
the blocks, and the way a mask-based implementation computes it). Full causal
attention (SDPA's own causal kernel) is shown for scale.

    python -m bench window --threads 2
    python -m bench window --window 32 --stride 32 --lengths 512 1024 2048
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from attnkit.nn.local_attention import local_attention
from attnkit.nn.masks import local_mask, slot_distance
from bench.harness import (
    Result,
    alternate,
    finish,
    markdown_row,
    opening,
    seconds_per_call,
)


def forward_backward_ms(attend: Callable[[], torch.Tensor]) -> Callable[[], float]:
    seconds = seconds_per_call(lambda: attend().sum().backward())
    return lambda: seconds() * 1e3


def measure(length: int, w: int, stride: int, reps: int) -> Result:
    q, k, v = (torch.randn(4, 8, length, 64, requires_grad=True) for _ in range(3))
    mask = local_mask(slot_distance(length, length), w, stride, causal=True)
    blockwise = forward_backward_ms(lambda: local_attention(q, k, v, w, stride, causal=True))
    masked = forward_backward_ms(lambda: F.scaled_dot_product_attention(q, k, v, mask))
    full = forward_backward_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    ours, peer = alternate(blockwise, masked, reps=reps)
    full()  # warm-up
    return Result(
        f"window {w}{f', stride {stride}' if stride else ''}, length {length}",
        "ms",
        ours,
        peer,
        "the pattern as a mask",
        higher_is_better=False,
        extra={"full causal attention, ms": statistics.median(full() for _ in range(reps))},
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench window", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--stride", type=int, default=0)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    header = opening(f"{args.threads} threads, {args.reps} reps")
    results = []
    for n in args.lengths:
        results.append(measure(n, args.window, args.stride, args.reps))
        print(markdown_row(results[-1]), flush=True)
    finish(results, header, args.out)


if __name__ == "__main__":
    main()
