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
sides alternate over repetitions and medians are reported, with ratios. The
output ids of both sides are compared as a sanity check. Writes JSON with --json.

    PYTHONPATH=src python bench/bench_generate.py --threads 2 --json bench/results_generate.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).parent))
from harness import peak_rss_added_mib, rss_in_subprocess
from hf_twins import gpt2_twins, marian_twins

from attnkit.generate import generate

VOCAB = 8000


def alternate(sides: dict[str, Callable[[], object]], reps: int) -> dict[str, list[float]]:
    """Seconds per call of each side over `reps` runs, the sides alternating in order."""
    for run in sides.values():
        run()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            sides[name]()
            times[name].append(time.perf_counter() - start)
    return times


def strip(rows: list[list[int]], eos: int) -> list[list[int]]:
    return [row[: row.index(eos)] if eos in row else row for row in rows]


def gpt2_sides(ours, hf, batch: int, new_tokens: int) -> dict[str, Callable[[], object]]:
    """Greedy generation of `new_tokens` after random 8-token prompts, on each side."""
    torch.manual_seed(batch)
    prompt = torch.randint(5, VOCAB, (batch, 8))
    mask = torch.ones_like(prompt)

    def run_ours():
        return generate(ours, prompt, mask, max_new_tokens=new_tokens, eos_token_id=None).sequences

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


def bench_gpt2(reps: int, new_tokens: int) -> list[dict]:
    ours, hf = gpt2_models()
    results = []
    for batch in (1, 8):
        sides = gpt2_sides(ours, hf, batch, new_tokens)
        with torch.no_grad():
            same = torch.equal(sides["attnkit"](), sides["transformers"]())
            seconds = alternate(sides, reps)
        tokens = batch * new_tokens
        results.append(_row(f"(a) GPT-2 greedy, batch {batch}", tokens, seconds, same))
    return results


def bench_marian(reps: int, new_tokens: int) -> dict:
    ours, hf = marian_models()
    sides = marian_sides(ours, hf, new_tokens)
    with torch.no_grad():
        a, b = sides["attnkit"](), sides["transformers"]()
        same = strip(a.sequences.tolist(), 2) == strip(b.tolist(), 2)
        tokens = sum(len(t) for t in a.new_tokens())
        seconds = alternate(sides, reps)
    return _row("(b) Marian beam 4, batch 32", tokens, seconds, same)


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


def bench_memory(threads: int, new_tokens: dict[str, int]) -> dict[str, dict[str, float]]:
    return {
        work: {
            side: rss_in_subprocess(
                "bench.bench_generate",
                *("--threads", str(threads), "--rss", work, side),
                *("--new-tokens", str(new_tokens[work])),
            )
            for side in ("attnkit", "transformers")
        }
        for work in MEMORY_WORKS
    }


def _row(name: str, tokens: int, seconds: dict[str, list[float]], same: bool) -> dict:
    """Tokens/s from the median run of each side; the best-run ratio shows the spread."""
    ours = tokens / statistics.median(seconds["attnkit"])
    theirs = tokens / statistics.median(seconds["transformers"])
    return {
        "benchmark": name,
        "tokens": tokens,
        "attnkit_tokens_per_s": ours,
        "transformers_tokens_per_s": theirs,
        "ratio": ours / theirs,
        "best_run_ratio": min(seconds["transformers"]) / min(seconds["attnkit"]),
        "seconds": seconds,
        "same_output_ids": same,
    }


@torch.no_grad()
def bench_positions(reps: int, steps: int = 16) -> dict:
    """attnkit ms per new token at positions 10 and 1,000, with the cache and with full forwards.

    The four measurements take turns within each repetition, so a change in
    the machine's load touches all of them alike; medians are reported.
    """
    model = gpt2_twins(6, 512, 8, VOCAB, 1280)[0]

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
    times: dict[str, list[float]] = {}
    for rep in range(reps + 1):
        for position, prompt in prompts.items():
            for name, fn in (("cached", cached), ("uncached", uncached)):
                seconds = fn(prompt)
                if rep:  # the first round is a warm-up
                    key = f"{name}_ms_per_token_at_{position}"
                    times.setdefault(key, []).append(seconds / steps * 1000)
    result = {key: statistics.median(values) for key, values in times.items()}
    for name in ("cached", "uncached"):
        result[f"{name}_ratio_1000_over_10"] = (
            result[f"{name}_ms_per_token_at_1000"] / result[f"{name}_ms_per_token_at_10"]
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=256, help="(a): new tokens per prompt")
    parser.add_argument("--beam-new-tokens", type=int, default=32, help="(b): most new tokens")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--rss", nargs=2, metavar=("WORK", "SIDE"), help="internal: one side's generation memory"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.rss:
        print(generation_memory_mib(*args.rss, args.new_tokens))
        return
    rows = [*bench_gpt2(args.reps, args.new_tokens), bench_marian(args.reps, args.beam_new_tokens)]
    header = f"{'benchmark':<30} {'attnkit tok/s':>14} {'transformers tok/s':>19} {'ratio':>7}"
    print(f"{header}  {'best-run ratio':>14}  same ids")
    for r in rows:
        print(
            f"{r['benchmark']:<30} {r['attnkit_tokens_per_s']:>14.1f} "
            f"{r['transformers_tokens_per_s']:>19.1f} {r['ratio']:>6.2f}x  "
            f"{r['best_run_ratio']:>13.2f}x  {r['same_output_ids']}"
        )
    positions = bench_positions(args.reps)
    print("\n(c) attnkit ms per new token (GPT-2 shape, batch 1)")
    for name in ("cached", "uncached"):
        at10 = positions[f"{name}_ms_per_token_at_10"]
        at1000 = positions[f"{name}_ms_per_token_at_1000"]
        ratio = positions[f"{name}_ratio_1000_over_10"]
        print(
            f"  {name:<9} position 10: {at10:7.2f} ms   "
            f"position 1000: {at1000:7.2f} ms   x{ratio:.2f}"
        )
    memory = bench_memory(
        args.threads,
        {"gpt2-greedy-batch32": args.new_tokens, "marian-beam4-batch32": args.beam_new_tokens},
    )
    print("\n(d) peak resident MiB one generation adds above the loaded models")
    for work, sides in memory.items():
        ours, theirs = sides["attnkit"], sides["transformers"]
        print(f"  {work:<22} attnkit {ours:8.1f}   transformers {theirs:8.1f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "threads": args.threads,
                    "reps": args.reps,
                    "torch": torch.__version__,
                    "transformers": transformers.__version__,
                    "machine": platform.machine(),
                    "processor": platform.processor(),
                    "results": rows,
                    "positions": positions,
                    "generation_memory_mib": memory,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
