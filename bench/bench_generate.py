"""Decoding speed of attnkit against Hugging Face `generate`, side by side on identical weights.

(a) greedy tokens/s of a GPT-2-shaped model (6 layers, d_model 512, 8 heads,
    vocab 8,000), batch 1 and batch 8, 256 new tokens;
(b) beam-4 translation tokens/s of a Marian-shaped model (6+6 layers,
    d_model 512), batch 32, sources of 20 tokens;
(c) attnkit's time per new token at position 1,000 against position 10, with
    the KV cache and without it (a full forward per token).

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


def bench_gpt2(reps: int, new_tokens: int) -> list[dict]:
    ours, hf = gpt2_twins(6, 512, 8, VOCAB, 1280)
    hf.generation_config.eos_token_id = None
    results = []
    for batch in (1, 8):
        torch.manual_seed(batch)
        prompt = torch.randint(5, VOCAB, (batch, 8))
        mask = torch.ones_like(prompt)

        def run_ours(prompt=prompt, mask=mask):
            return generate(ours, prompt, mask, max_new_tokens=new_tokens, eos_token_id=None)

        def run_hf(prompt=prompt, mask=mask):
            return hf.generate(
                prompt,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )

        with torch.no_grad():
            same = torch.equal(run_ours().sequences, run_hf())
            seconds = alternate({"attnkit": run_ours, "transformers": run_hf}, reps)
        tokens = batch * new_tokens
        results.append(_row(f"(a) GPT-2 greedy, batch {batch}", tokens, seconds, same))
    return results


def bench_marian(reps: int, new_tokens: int) -> dict:
    ours, hf = marian_twins(6, 512, 8, VOCAB, 512)
    torch.manual_seed(0)
    src = torch.randint(5, VOCAB, (32, 20))
    src[:, -1] = 2
    mask = torch.ones_like(src)
    options = {"num_beams": 4, "max_new_tokens": new_tokens}

    def run_ours():
        return generate(ours, src, mask, decoder_start_token_id=0, pad_token_id=0, **options)

    def run_hf():
        return hf.generate(src, attention_mask=mask, do_sample=False, **options)

    with torch.no_grad():
        a, b = run_ours(), run_hf()
        same = strip(a.sequences.tolist(), 2) == strip(b.tolist(), 2)
        tokens = sum(len(t) for t in a.new_tokens())
        seconds = alternate({"attnkit": run_ours, "transformers": run_hf}, reps)
    return _row("(b) Marian beam 4, batch 32", tokens, seconds, same)


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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
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
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
