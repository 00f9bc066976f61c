"""The variants on real data: Tiny Shakespeare's character-level GPT, one change at a time.

Each row trains the tinyshakespeare_char recipe (nanoGPT's CPU recipe: 4 layers,
d_model 128, context 64, batch 12, no biases, 2,000 steps, cosine from 1e-3) with the row's
`[model]` changes and reports the validation loss at the end (same 90/10 split,
same seed, same batches), the parameters and the training time. Gated
feed-forward rows use d_ff 352 so their three matrices hold what the plain two
of d_ff 512 hold.

    python -m bench variants [--steps 2000] [--only RoPE ALiBi ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

from attnkit import ModelConfig, build_model, recipes
from attnkit.run import RunFolder
from attnkit.train.run_config import RunConfig
from attnkit.train.tasks import train as train_run
from bench.harness import opening

CONFIG = recipes.path("tinyshakespeare_char")
GATED = {"activation": "swiglu", "d_ff": 352}
VARIANTS: dict[str, dict[str, object]] = {
    "gpt-tiny (learned positions, GELU, LayerNorm, pre-LN)": {},
    "RoPE": {"positional": "rope"},
    "ALiBi": {"positional": "alibi"},
    "SwiGLU": GATED,
    "RMSNorm": {"norm": "rmsnorm"},
    "GQA, 2 key/value heads": {"n_kv_heads": 2},
    "sliding window of 16": {"attention_window": 16},
    "DeepNorm (post-LN)": {"norm_position": "deepnorm"},
    "mixture of 4 experts, top 2": {"n_experts": 4, "n_experts_per_token": 2},
    "mixture of 4 experts, Switch (top 1, capacity 1.25)": {
        "n_experts": 4,
        "n_experts_per_token": 1,
        "router": "switch",
        "capacity_factor": 1.25,
    },
    "llama-tiny (RoPE, RMSNorm, SwiGLU, GQA 2)": {"preset": "llama-tiny", **GATED},
}


def train(changes: dict[str, object], steps: int, out: Path) -> dict[str, float]:
    sets = [f"model.{key}={json.dumps(value)}" for key, value in changes.items()]
    sets += [f"train.steps={steps}", f"train.out_dir={json.dumps(str(out))}"]
    sets += [f"train.save_every={steps}", f"eval.every={steps}", "train.log_every=500"]
    start = time.perf_counter()
    train_run(RunConfig.load(CONFIG, sets))
    seconds = time.perf_counter() - start
    folder = RunFolder(out)
    records = folder.read_metrics()
    val = [r["val_loss"] for r in records if "val_loss" in r][-1]
    # Tokens over an expert's capacity, summed over the logged steps (Switch routing only).
    dropped = sum(r.get("dropped_tokens", 0) for r in records)
    model = build_model(ModelConfig.from_json(folder.config))
    return {
        "val_loss": val,
        "seconds": seconds,
        "parameters": model.num_parameters(),
        "dropped": dropped,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench variants", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--only", nargs="*", help="rows whose name starts with one of these")
    args = parser.parse_args(argv)
    # The Trainer's log lines (every 500 steps, each evaluation) show the progress, as in
    # `attnkit train`.
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    opening(f"{args.steps} steps")
    rows = [
        name
        for name in VARIANTS
        if not args.only or any(name.startswith(prefix) for prefix in args.only)
    ]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(rows):
            results[name] = train(VARIANTS[name], args.steps, Path(tmp) / str(i))
    print(f"\n| variant | parameters | val loss after {args.steps} steps | training time |", end="")
    print(" tokens dropped (logged steps) |\n| --- | ---: | ---: | ---: | ---: |")
    for name, r in results.items():
        print(
            f"| {name} | {r['parameters']:,} | {r['val_loss']:.3f} | {r['seconds']:.0f} s "
            f"| {r['dropped']:,} |"
        )


if __name__ == "__main__":
    main()
