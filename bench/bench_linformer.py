"""Linformer's self-attention against full attention: time and memory at growing lengths.

Forward and backward of one encoder self-attention layer (batch 1, d_model 256 in 4 heads of
64, no padding), Linformer projecting keys and values to k = 256 rows (`nn/linformer.py`,
O(n k)) against the paper's attention on torch's fused kernel (`MultiHeadAttention`,
O(n^2) time). The memory is the peak resident memory each side adds, each in a process of its
own (`--side`), so neither counts the other's allocations.

    python -m bench linformer --threads 2
    python -m bench linformer --lengths 1024 2048 --k 128
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from attnkit.nn.attention import MultiHeadAttention
from attnkit.nn.linformer import LinformerAttention, LinformerProjection
from bench.harness import (
    Result,
    alternate,
    finish,
    markdown_row,
    opening,
    peak_rss_added_mib,
    rss_in_subprocess,
    seconds_per_call,
)

D_MODEL, HEADS = 256, 4


def layer(side: str, length: int, k: int) -> torch.nn.Module:
    torch.manual_seed(0)
    if side == "linformer":
        return LinformerAttention(D_MODEL, HEADS, LinformerProjection(k, length))
    return MultiHeadAttention(D_MODEL, HEADS)


def step(attention: torch.nn.Module, length: int):
    x = torch.randn(1, length, D_MODEL, requires_grad=True)
    return lambda: attention(x)[0].sum().backward()


def measure(length: int, k: int, reps: int, threads: int) -> Result:
    def side_args(side: str) -> list[str]:
        return ["--side", side, "--lengths", str(length), "--k", str(k), "--threads", str(threads)]

    ours = seconds_per_call(step(layer("linformer", length, k), length))
    peer = seconds_per_call(step(layer("full", length, k), length))
    ours_s, peer_s = alternate(ours, peer, reps=reps)
    memory = {
        f"{side} peak MiB added": rss_in_subprocess("bench.bench_linformer", *side_args(side))
        for side in ("linformer", "full")
    }
    return Result(
        f"length {length}, k {k}, forward + backward",
        "ms",
        [s * 1e3 for s in ours_s],
        [s * 1e3 for s in peer_s],
        "full attention (SDPA)",
        higher_is_better=False,
        extra=memory,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench linformer", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--k", type=int, default=256)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument(
        "--side",
        choices=("linformer", "full"),
        default=None,
        help="measure one side's peak memory alone (a subprocess of the run)",
    )
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.side:
        length = args.lengths[0]
        run = step(layer(args.side, length, args.k), length)
        print(peak_rss_added_mib(run))
        return
    header = opening(f"{args.threads} threads, {args.reps} reps, path: {__name__}")
    results = []
    for n in args.lengths:
        results.append(measure(n, args.k, args.reps, args.threads))
        print(markdown_row(results[-1]), flush=True)
    finish(results, header, args.out)


if __name__ == "__main__":
    main()
