"""Decoding on a GPU: attnkit's `generate` against transformers' on the same random weights.

(a) GPT-2 small's shape (12 layers, d_model 768, 12 heads, vocabulary 50,257), greedy,
    prompts of 8 tokens and 256 new ones, at batch 1, 8 and 64;
(b) a Marian shape (6 + 6 layers, d_model 512, vocabulary 8,000), beam 4, batch 32,
    sources of 20 tokens, at most 30 new ones;
each with float32 and with bfloat16 weights. Ours decodes on the static cache with the
step compiled and replayed as a CUDA graph (`cache_implementation="static"`; its
compilation happens in the warm-up) and, for comparison, on the dynamic cache in
eager mode, greedy and beam search alike. Reported: tokens/s (new tokens of
every row over the wall time, median of `--reps`), the ratio to transformers, and how
many rows give the same tokens as transformers and as our eager dynamic decoding (the
same weights and dtype; bfloat16 rounds differently on each path, so rows may part).

    python -m bench generate --device cuda [--reps 3] [--out bench/results/generate_gpu]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

from attnkit.generation import generate
from bench.harness import Result, finish, opening
from bench.peers.hf_models import before_eos, gpt2_twins, marian_twins

GPT2 = (12, 768, 12, 50257, 1024)
MARIAN = (6, 512, 8, 8000, 256)
TINY = {"gpt2": (2, 64, 2, 500, 512), "marian": (1, 32, 2, 500, 64)}  # --device cpu: a dry run


def timed(run: Callable[[], torch.Tensor], reps: int, device: str) -> tuple[float, torch.Tensor]:
    """Median seconds of `reps` runs after one warm-up (compilation), and the last output."""
    out = run()
    seconds = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = run()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), out


def static_or_dynamic(
    run: Callable[[], torch.Tensor],
    dynamic: tuple[float, torch.Tensor],
    args: argparse.Namespace,
    where: str,
) -> tuple[float, torch.Tensor, dict[str, str]]:
    """`timed(run)` on the static cache; if it fails, the dynamic cache's figures, and a note
    for the row that says they are (the other rows still run)."""
    try:
        return (*timed(run, args.reps, args.device), {})
    except Exception as error:
        print(f"static cache {where} failed: {error!r}"[:2000], flush=True)
        return (*dynamic, {"static cache": f"FAILED ({type(error).__name__}): dynamic shown"})


def same_rows(a: torch.Tensor, b: torch.Tensor) -> str:
    return f"{sum(int(torch.equal(x, y)) for x, y in zip(a, b, strict=True))}/{len(a)}"


def gpt2(dtype: torch.dtype, args: argparse.Namespace) -> list[Result]:
    shape = GPT2 if args.device == "cuda" else TINY["gpt2"]
    ours, hf = gpt2_twins(*shape)
    ours, hf = ours.to(args.device, dtype).eval(), hf.to(args.device, dtype).eval()
    results, n = [], args.new_tokens
    options = {"max_new_tokens": n, "eos_token_id": ()}  # every row decodes n tokens
    for batch in args.batches:
        torch.manual_seed(batch)
        prompt = torch.randint(5, shape[3] - 10, (batch, 8), device=args.device)
        mask = torch.ones_like(prompt)

        def static(prompt=prompt, mask=mask) -> torch.Tensor:
            out = generate(ours, prompt, mask, cache_implementation="static", **options)
            return out.sequences[:, 8:]

        def dynamic(prompt=prompt, mask=mask) -> torch.Tensor:
            return generate(ours, prompt, mask, **options).sequences[:, 8:]

        def peer(prompt=prompt, mask=mask) -> torch.Tensor:
            out = hf.generate(
                prompt, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=0
            )
            return out[:, 8:]

        with torch.inference_mode():
            t_dynamic, o_dynamic = timed(dynamic, args.reps, args.device)
            t_peer, o_peer = timed(peer, args.reps, args.device)
            t_static, o_static, failed = static_or_dynamic(
                static, (t_dynamic, o_dynamic), args, f"at batch {batch}"
            )
        rate = batch * n
        results.append(
            Result(
                f"GPT-2 small greedy batch {batch} {str(dtype)[6:]}",
                "tokens/s",
                [rate / t_static],
                [rate / t_peer],
                "transformers generate",
                extra={
                    "ours dynamic eager": rate / t_dynamic,
                    "same as transformers": same_rows(o_static, o_peer),
                    "same as dynamic": same_rows(o_static, o_dynamic),
                    **failed,
                },
            )
        )
        print(results[-1].name, f"{results[-1].ratio:.2f}x", results[-1].extra, flush=True)
    return results


def marian(dtype: torch.dtype, args: argparse.Namespace) -> list[Result]:
    shape = MARIAN if args.device == "cuda" else TINY["marian"]
    ours, hf = marian_twins(*shape)
    ours, hf = ours.to(args.device, dtype).eval(), hf.to(args.device, dtype).eval()
    torch.manual_seed(0)
    src = torch.randint(5, shape[3] - 1, (32, 20), device=args.device)
    src[:, -1] = 2
    mask = torch.ones_like(src)
    beams = {"num_beams": 4, "max_new_tokens": 30, "decoder_start_token_id": 0, "pad_token_id": 0}

    def decode(cache: str) -> torch.Tensor:
        return generate(ours, src, mask, cache_implementation=cache, **beams).sequences

    with torch.inference_mode():
        t_dynamic, o_dynamic = timed(lambda: decode("dynamic"), args.reps, args.device)
        t_peer, o_peer = timed(
            lambda: hf.generate(src, attention_mask=mask, num_beams=4, max_new_tokens=30),
            args.reps,
            args.device,
        )
        t_static, o_static, failed = static_or_dynamic(
            lambda: decode("static"), (t_dynamic, o_dynamic), args, "in beam search"
        )
    peer = before_eos([r[1:] for r in o_peer.tolist()], 2)

    def agree(out: torch.Tensor) -> str:
        rows = before_eos([r[1:] for r in out.tolist()], 2)
        return f"{sum(x == y for x, y in zip(rows, peer, strict=True))}/32"

    result = Result(
        f"Marian beam 4 batch 32 {str(dtype)[6:]}",
        "sentences/s",
        [32 / t_static],
        [32 / t_peer],
        "transformers generate",
        extra={
            "ours dynamic eager": 32 / t_dynamic,
            "same as transformers": agree(o_static),
            "dynamic same as transformers": agree(o_dynamic),
            **failed,
        },
    )
    print(result.name, f"{result.ratio:.2f}x", result.extra, flush=True)
    return [result]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench generate --device cuda", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--device", default="cuda", help="cuda; cpu only tries the benchmark out")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    if args.device != "cpu" and not torch.cuda.is_available():
        raise SystemExit("python -m bench generate --device cuda needs a CUDA device")
    header = opening(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {args.reps} reps"
    )
    results = []
    for name in args.dtypes:
        dtype = getattr(torch, name)
        results += gpt2(dtype, args) + marian(dtype, args)
    finish(results, header, args.out)


if __name__ == "__main__":
    main()
