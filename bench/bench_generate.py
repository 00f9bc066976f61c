"""Decoding speed of attnkit against Hugging Face `generate`, side by side on identical weights.

(a) greedy tokens/s of a GPT-2-shaped model (6 layers, d_model 512, 8 heads,
    vocab 8,000), batch 1 and batch 8, 256 new tokens;
(b) beam-4 translation tokens/s of a Marian-shaped model (6+6 layers,
    d_model 512), batch 32, sources of 20 tokens;
(c) attnkit's time per new token at position 1,000 against position 10, with
    the KV cache and without it (a full forward per token);
(d) the peak memory one generation at batch 32 adds, (a) and (b), each side
    in its own process.

Both sides run in one process with the same thread count; after a warm-up the
sides alternate over repetitions, each side first in every other one, and
medians are reported, with ratios. The output ids of both sides are compared
as a sanity check. Writes OUT.json and OUT.md with --out.

    python -m bench generate --threads 2 --reps 5 --out bench/results/generate
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
from bench.peers.hf_models import before_eos, gpt2_twins, marian_twins

VOCAB = 8000


def gpt2_sides(ours, hf, batch: int, new_tokens: int) -> dict[str, Callable[[], object]]:
    """Greedy generation of `new_tokens` after random 8-token prompts, on each side."""
    torch.manual_seed(batch)
    prompt = torch.randint(5, VOCAB, (batch, 8))
    mask = torch.ones_like(prompt)

    def run_ours():
        return generate(ours, prompt, mask, max_new_tokens=new_tokens, eos_token_id=()).sequences

    def run_hf():
        return hf.generate(
            prompt,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )

    return {"attnkit": run_ours, "transformers": run_hf}


def marian_sides(ours, hf, new_tokens: int) -> dict[str, Callable[[], object]]:
    """Beam-4 translation of 32 random 20-token sources, on each side."""
    torch.manual_seed(0)
    src = torch.randint(5, VOCAB, (32, 20))
    src[:, -1] = 2
    mask = torch.ones_like(src)
    options = {"num_beams": 4, "max_new_tokens": new_tokens}

    def run_ours():
        return generate(ours, src, mask, decoder_start_token_id=0, pad_token_id=0, **options)

    def run_hf():
        return hf.generate(src, attention_mask=mask, do_sample=False, **options)

    return {"attnkit": run_ours, "transformers": run_hf}


def gpt2_models():
    ours, hf = gpt2_twins(6, 512, 8, VOCAB, 1280)
    hf.generation_config.eos_token_id = None
    return ours, hf


def marian_models():
    return marian_twins(6, 512, 8, VOCAB, 512)


def _seconds(sides: dict[str, Callable[[], object]], reps: int) -> list[list[float]]:
    """Seconds per call of each side over `reps` runs, each side first in every other run."""
    return alternate(*map(seconds_per_call, sides.values()), reps=reps, swap=True)


def bench_gpt2(reps: int, new_tokens: int) -> list[Result]:
    ours, hf = gpt2_models()
    results = []
    for batch in (1, 8):
        sides = gpt2_sides(ours, hf, batch, new_tokens)
        with torch.no_grad():
            same = torch.equal(sides["attnkit"](), sides["transformers"]())
            seconds = _seconds(sides, reps)
        tokens = batch * new_tokens
        results.append(_result(f"(a) GPT-2 greedy, batch {batch}", tokens, seconds, same))
    return results


def bench_marian(reps: int, new_tokens: int) -> Result:
    ours, hf = marian_models()
    sides = marian_sides(ours, hf, new_tokens)
    with torch.no_grad():
        a, b = sides["attnkit"](), sides["transformers"]()
        same = before_eos(a.sequences.tolist(), 2) == before_eos(b.tolist(), 2)
        tokens = sum(len(t) for t in a.new_tokens())
        seconds = _seconds(sides, reps)
    return _result("(b) Marian beam 4, batch 32", tokens, seconds, same)


# Memory: what one generation at batch 32 adds to the resident set of a process that
# holds both models. Each side runs in a fresh process so neither inherits the other's
# freed-but-resident pages; the kernel's peak (VmHWM) is reset just before generating.
MEMORY_WORKS = {
    "gpt2-greedy-batch32": lambda new_tokens: gpt2_sides(*gpt2_models(), 32, new_tokens),
    "marian-beam4-batch32": lambda new_tokens: marian_sides(*marian_models(), new_tokens),
}


@torch.no_grad()
def generation_memory_mib(work: str, side: str, new_tokens: int) -> float:
    """Peak resident MiB that one generation adds above the loaded models (Linux only)."""
    return peak_rss_added_mib(MEMORY_WORKS[work](new_tokens)[side])


def bench_memory(threads: int, new_tokens: dict[str, int]) -> list[Result]:
    """(d): what one generation adds, each side measured in a process of its own."""

    def mib(work: str, side: str) -> list[float]:
        options = ("--threads", str(threads), "--rss", work, side)
        return [
            rss_in_subprocess(
                "bench.bench_generate", *options, "--new-tokens", str(new_tokens[work])
            )
        ]

    return [
        Result(
            f"(d) {work}, memory one generation adds",
            "MiB",
            mib(work, "attnkit"),
            mib(work, "transformers"),
            "transformers",
            higher_is_better=False,
        )
        for work in MEMORY_WORKS
    ]


def _result(name: str, tokens: int, seconds: list[list[float]], same: bool) -> Result:
    """Tokens/s of each run of each side; the best-run ratio shows the spread."""
    ours, theirs = seconds
    return Result(
        name,
        "tokens/s",
        [tokens / s for s in ours],
        [tokens / s for s in theirs],
        "transformers",
        extra={
            "tokens": tokens,
            "best-run ratio": f"{min(theirs) / min(ours):.2f}x",
            "same ids": "yes" if same else "no",
        },
    )


@torch.no_grad()
def bench_positions(reps: int, steps: int = 16) -> list[Result]:
    """attnkit ms per new token at positions 10 and 1,000, with the cache and with full forwards.

    The four measurements take turns within each repetition, after a first
    round as warm-up, so a change in the machine's load touches all of them
    alike; medians are reported.
    """
    model = gpt2_models()[0]

    def cached(prompt: torch.Tensor) -> float:
        cache = model.new_cache(prompt, capacity=prompt.shape[1] + steps)
        model.decode_step(prompt, cache)
        next_id = prompt[:, -1:]
        start = time.perf_counter()
        for _ in range(steps):
            model.decode_step(next_id, cache)
        return time.perf_counter() - start

    def uncached(prompt: torch.Tensor) -> float:
        ids = prompt
        start = time.perf_counter()
        for _ in range(steps):
            model(ids).logits[:, -1]
            ids = torch.cat([ids, ids[:, -1:]], dim=1)
        return time.perf_counter() - start

    prompts = {position: torch.randint(5, VOCAB, (1, position)) for position in (10, 1000)}
    sides = {
        (name, position): lambda fn=fn, prompt=prompt: fn(prompt) / steps * 1000
        for position, prompt in prompts.items()
        for name, fn in (("cached", cached), ("uncached", uncached))
    }
    times = dict(zip(sides, alternate(*sides.values(), reps=reps), strict=True))
    results = []
    for name in ("cached", "uncached"):
        at10, at1000 = times[name, 10], times[name, 1000]
        slower = statistics.median(at1000) / statistics.median(at10)
        results.append(Result(f"(c) {name}, position 10", "ms per new token", at10))
        results.append(
            Result(
                f"(c) {name}, position 1000",
                "ms per new token",
                at1000,
                extra={"over position 10": f"x{slower:.2f}"},
            )
        )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench generate", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=256, help="(a): new tokens per prompt")
    parser.add_argument("--beam-new-tokens", type=int, default=32, help="(b): most new tokens")
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    parser.add_argument(
        "--rss", nargs=2, metavar=("WORK", "SIDE"), help="internal: one side's generation memory"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.rss:
        print(generation_memory_mib(*args.rss, args.new_tokens))
        return
    header = opening(
        f"{args.threads} threads, {args.reps} reps, transformers {transformers.__version__}"
    )
    new_tokens = {
        "gpt2-greedy-batch32": args.new_tokens,
        "marian-beam4-batch32": args.beam_new_tokens,
    }
    results = []
    for measure in (
        lambda: bench_gpt2(args.reps, args.new_tokens),
        lambda: [bench_marian(args.reps, args.beam_new_tokens)],
        lambda: bench_positions(args.reps),
        lambda: bench_memory(args.threads, new_tokens),
    ):
        for result in measure():
            results.append(result)
            print(markdown_row(result), flush=True)
    finish(results, header, args.out)


if __name__ == "__main__":
    main()
