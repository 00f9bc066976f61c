"""Causal self-attention on each of torch's fused kernels, and the causal flag against a mask.

Forward and backward of `scaled_dot_product_attention` (batch 4, 8 heads of
64, causal) at each length, on the CPU or, where there is one, a GPU
(`--device cuda`): every `attention_backend` that runs there, each against
the math kernel (matmul and softmax), with the kernels that ran
(`attnkit.nn.sdpa_backend.kernels_run`); and the same causality given as a
dense boolean mask instead of the flag, which is what attnkit no longer does
for right-padded batches.

    python -m bench attention --threads 2 [--device cuda] [--lengths 256 1024]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

from attnkit.errors import AttnkitError
from attnkit.nn.masks import causal_mask
from attnkit.nn.scaled_dot_product import scaled_dot_product_attention
from attnkit.nn.sdpa_backend import BACKENDS, kernels_run
from bench.harness import Result, alternate, finish, markdown_row, opening, seconds_per_call


def sides(length: int, device: str, dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    """Forward and backward on each backend that runs these inputs, and with a dense mask."""
    q, k, v = (
        torch.randn(4, 8, length, 64, device=device, dtype=dtype, requires_grad=True)
        for _ in range(3)
    )
    mask = causal_mask(length, length, q.device)

    def step(backend: str = "auto", dense: bool = False) -> Callable[[], object]:
        def run() -> None:
            causal = {"mask": mask} if dense else {"is_causal": True}
            out, _ = scaled_dot_product_attention(q, k, v, backend=backend, **causal)
            out.sum().backward()
            if device == "cuda":
                torch.cuda.synchronize()

        return run

    runs = {}
    for backend in BACKENDS:
        try:
            step(backend)()
        except AttnkitError:
            continue
        runs[backend] = step(backend)
    runs["auto, causality as a dense mask"] = step(dense=True)
    return runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench attention", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device_line = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    header = opening(f"{args.threads} threads, {args.reps} reps, {device_line}, {args.dtype}")
    results = []
    for length in args.lengths:
        runs = sides(length, args.device, getattr(torch, args.dtype))
        ran = {name: ", ".join(sorted(kernels_run(run))) for name, run in runs.items()}
        seconds = alternate(*map(seconds_per_call, runs.values()), reps=args.reps, swap=True)
        ms = {name: [s * 1e3 for s in side] for name, side in zip(runs, seconds, strict=True)}
        for name, side in ms.items():
            results.append(
                Result(
                    f"length {length}, {name}",
                    "ms forward + backward",
                    side,
                    ms["math"],
                    "math",
                    higher_is_better=False,
                    extra={"kernels that ran": ran[name]},
                )
            )
            print(markdown_row(results[-1]), flush=True)
    finish(results, header, args.out)


if __name__ == "__main__":
    main()
