"""Train short, test long: perplexity past the trained length, one line per positional method.

As Press et al. (ALiBi, 2022) and Sun et al. (xPos, 2022) measure it: the same
character-level language model (the tinyshakespeare_char recipe: nanoGPT's
CPU recipe, 4 layers, d_model 128, trained on blocks of 64 characters) is
trained once with each way of giving it positions, then scored on Tiny
Shakespeare's validation text cut into blocks of 64, 128, 256, 512 and 1,024
characters (`attnkit eval RUN --block-size L --set model.max_len=L`):

- sinusoidal and learned positions (learned only at the trained length: its
  table has 64 rows, which attnkit refuses to read past);
- RoPE, as trained, and with NTK scaling set at evaluation to L / 64;
- ALiBi; xPos, with its scale base B set to 32 (the paper's B / L ratio:
  512 for its 1,024-token training); RoPE in a sliding window of 64.

Runs are kept under --runs (one folder per method, trained only if missing),
so the evaluation can be repeated. Writes OUT.json, OUT.md and OUT.png.

    python -m bench extrapolation --runs runs/extrapolation --out bench/results/extrapolation
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from attnkit import recipes
from attnkit.errors import AttnkitError
from attnkit.evaluation.run import evaluate_run
from attnkit.run import load_run
from attnkit.train.run_config import RunConfig
from attnkit.train.tasks import train as train_run
from bench.harness import opening

CONFIG = recipes.path("tinyshakespeare_char")
TRAINED = 64
LENGTHS = (64, 128, 256, 512, 1024)

# Each method: the run it reads (trained with its [model] changes) and the overrides of an
# evaluation at length L (max_len L always).
ROPE = {"positional": "rope"}
METHODS: dict[str, tuple[str, dict[str, object], dict[str, object]]] = {
    "sinusoidal": ("sinusoidal", {"positional": "sinusoidal"}, {}),
    "learned": ("learned", {"positional": "learned"}, {}),
    "RoPE": ("rope", ROPE, {}),
    "RoPE + NTK at evaluation": ("rope", ROPE, {"rope_scaling": "L / 64"}),
    "ALiBi": ("alibi", {"positional": "alibi"}, {}),
    "xPos (B = 32)": ("xpos", {"positional": "xpos", "xpos_scale_base": 32.0}, {}),
    "RoPE, sliding window 64": ("window", {**ROPE, "attention_window": TRAINED}, {}),
}


def train(
    folder: Path, changes: dict[str, object], steps: int, data_dir: str, threads: int
) -> None:
    if (folder / "model.safetensors").is_file():
        return
    sets = [f"model.{key}={json.dumps(value)}" for key, value in changes.items()]
    sets += [f"train.steps={steps}", f"train.out_dir={json.dumps(str(folder))}"]
    sets += [f"data.data_dir={json.dumps(data_dir)}", f"train.save_every={steps}"]
    sets += [f"train.threads={threads}"]
    train_run(RunConfig.load(CONFIG, sets))


def loss_at(folder: Path, length: int, overrides: dict[str, object], data_dir: str) -> float:
    """Validation loss (nats per character) on blocks of `length`, or NaN where refused."""
    values = {k: length / TRAINED if v == "L / 64" else v for k, v in overrides.items()}
    try:
        run = load_run(folder, overrides={"max_len": length, **values})
    except AttnkitError as refused:
        print(f"  {folder.name} at {length}: {refused}")
        return math.nan
    scores = evaluate_run(
        run, corpus="tinyshakespeare", split="val", data_dir=data_dir, block_size=length
    ).scores
    return next(s.value for s in scores if s.name == "loss")


def plot(table: dict[str, dict[int, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, losses in table.items():
        points = [(n, math.exp(v)) for n, v in losses.items() if not math.isnan(v)]
        ax.plot(*zip(*points, strict=True), marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(LENGTHS, [str(n) for n in LENGTHS])
    ax.axvline(TRAINED, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("evaluation length (characters); trained on 64")
    ax.set_ylabel("validation perplexity (log scale)")
    ax.set_title("Tiny Shakespeare, trained short, evaluated long")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench extrapolation", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--runs", type=Path, default=Path("runs/extrapolation"))
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json/.md/.png")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    header = opening(f"{args.threads} threads, {args.steps} steps, trained on {TRAINED}")
    for folder, changes, _ in {m[0]: m for m in METHODS.values()}.values():
        train(args.runs / folder, changes, args.steps, args.data_dir, args.threads)
    table = {
        name: {n: loss_at(args.runs / folder, n, evals, args.data_dir) for n in LENGTHS}
        for name, (folder, _, evals) in METHODS.items()
    }
    lines = [
        "| method | " + " | ".join(f"{n} ({n // TRAINED}x)" for n in LENGTHS) + " |",
        "| --- |" + " ---: |" * len(LENGTHS),
    ]
    for name, losses in table.items():
        cells = ["refused" if math.isnan(v) else f"{math.exp(v):.2f}" for v in losses.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    print("\nvalidation perplexity per character\n" + "\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(
            json.dumps({"machine": header, "losses": table}, indent=1)
        )
        args.out.with_suffix(".md").write_text(header + "\n\n" + "\n".join(lines) + "\n")
        plot(table, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
