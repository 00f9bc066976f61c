"""A decoding step on the static KV cache, compiled, against the same step in eager mode.

    python -m bench static-step [--layers 4] [--batch 64] [--capacities 64 1024] [--threads 2]

A decoder (d_model 64, 4 heads) decodes one token a row on a `StaticKVCache` of each
capacity: torch.compile's step (inductor, on this CPU) against `decode_step` run eagerly,
alternating, median of `--reps` rounds of 20 steps. A compiled step writes each layer's new
keys and values at their slot; when the cache was one buffer sliced per layer, it rewrote the
whole buffer at every layer instead (260 ms a step against 32 ms eager at capacity 1,024), so
the ratio falling with the capacity is the sign of that fault.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from attnkit.config import ModelConfig
from attnkit.generation import static_cache
from attnkit.generation.config import resolve
from attnkit.generation.state import prefill
from attnkit.models import build_model
from bench.harness import Result, alternate, finish, opening, seconds_per_call


def measured(capacity: int, args: argparse.Namespace) -> Result:
    shape = {
        "shape": "decoder",
        "vocab_size": 100,
        "d_model": 64,
        "n_heads": 4,
        "d_ff": 128,
        "tie_embeddings": "decoder",
    }
    config = ModelConfig.from_dict(
        {**shape, "n_decoder_layers": args.layers, "max_len": capacity + 8, "dropout": 0.0}
    )
    torch.manual_seed(0)
    model = build_model(config).eval()
    prompt = torch.randint(5, 95, (args.batch, 4))
    cfg = resolve(None, {"max_new_tokens": capacity}, model.config)
    with torch.no_grad():
        cache = static_cache.static_like(prefill(model, prompt, None, cfg)[0].cache)
        model.decode_step(prompt, cache)
        torch._dynamo.reset()
        compiled = torch.compile(type(model).decode_step, fullgraph=True)
        ids = torch.ones(args.batch, 1, dtype=torch.long)
        prefix = int(cache.slot)

        def rewound(step):
            # Back to the slot after the prefix, so the steps of every round fit the capacity.
            def run() -> None:
                cache.slot.fill_(prefix)
                cache.n_real.fill_(prefix)
                step(model, ids, cache)

            return run

        sides = (
            seconds_per_call(rewound(compiled), 20),
            seconds_per_call(rewound(type(model).decode_step), 20),
        )
        ours, eager = alternate(*sides, reps=args.reps, warmup=1, swap=True)
    mib = sum(t.numel() * t.element_size() for t in (*cache.keys, *cache.values)) / 2**20
    return Result(
        f"static-cache step, capacity {capacity} ({mib:.0f} MiB of keys and values)",
        "ms",
        [s * 1e3 for s in ours],
        [s * 1e3 for s in eager],
        "the same step, eager",
        higher_is_better=False,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench static-step", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--capacities", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    header = opening(f"{args.layers} layers, batch {args.batch}, {args.threads} threads")
    finish([measured(capacity, args) for capacity in args.capacities], header, args.out)


if __name__ == "__main__":
    main()
