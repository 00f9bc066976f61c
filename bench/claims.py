"""The study notes' claims put to experiment on Tiny Shakespeare, three seeds each.

The recipe is `tinyshakespeare_char` (nanoGPT's CPU recipe: 4 layers, 4 heads, d_model
128, d_ff 512, learned positions, context 64, 2,000 steps), changed one setting at a time:

- d_ff: "a larger d_ff improves results" (notes 004:583): d_ff at 1x, 2x, 4x (the recipe)
  and 8x d_model at equal steps, with the parameter count and the training's wall time;
- positions: "learned positions work as well as sinusoidal ones" (notes 002:444): the
  recipe's learned positions against sinusoidal ones, and, as the recipe does not scale its
  token embeddings (standard deviation 0.02) and a code of amplitude 1 drowns them,
  against sinusoidal ones at amplitude 0.1 (`positional_scale`);
- interpolation: sinusoidal positions "interpolate smoothly" (notes 001:131): each
  sinusoidal model, trained on blocks of 64, is scored on blocks of 64 (the trained
  positions), on blocks of 128 read as they are (positions 64..127 never trained:
  extrapolation), and on blocks of 128 with position interpolation (positions scaled by
  64/128, so they fall at 0, 0.5, 1, ..., 63.5, between the trained ones:
  `--set model.positional_interpolation=2`), and on blocks of 64 with the same
  interpolation (positions 0, 0.5, ..., 31.5: the same context, every other position one it
  never trained on).

Every number is the loss (nats per character) on the whole validation split, as
`attnkit eval RUN --block-size L` gives it. Runs go one at a time (the order puts the
recipe, sinusoidal and 1x d_ff first, then 2x, 8x and amplitude 0.1, seed by seed), each
in its folder under --runs with `claims.json` (wall time, parameters, the losses): a run
whose weights exist is not trained again and a loss already measured is not measured again, so the
command resumes where it stopped, and `--no-train` measures what is missing and writes the
tables.

    OMP_NUM_THREADS=1 python -m bench claims --threads 1 --runs runs/claims \\
        --out bench/results/claims

(`--steps 500` trains a quarter of the recipe's 2,000 steps, its cosine schedule over 500.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
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
D_MODEL, TRAINED = 128, 64
SEEDS = (0, 1, 2)

# Each variant: its [model] changes from the recipe.
VARIANTS: dict[str, dict[str, object]] = {
    "d_ff 4x (recipe, learned)": {},
    "sinusoidal": {"positional": "sinusoidal"},
    "d_ff 1x": {"d_ff": 1 * D_MODEL},
    "d_ff 2x": {"d_ff": 2 * D_MODEL},
    "d_ff 8x": {"d_ff": 8 * D_MODEL},
    "sinusoidal, amplitude 0.1": {"positional": "sinusoidal", "positional_scale": 0.1},
}
FOLDERS = {
    "d_ff 4x (recipe, learned)": "recipe",
    "sinusoidal": "sinusoidal",
    "d_ff 1x": "dff1x",
    "d_ff 2x": "dff2x",
    "d_ff 8x": "dff8x",
    "sinusoidal, amplitude 0.1": "sinusoidal-a0.1",
}
# The order of training: every seed of the recipe, sinusoidal and 1x first, then 2x, 8x and
# sinusoidal at amplitude 0.1 seed by seed, so that a run cut short has seeds of each.
ORDER = [(v, s) for s in SEEDS for v in list(VARIANTS)[:3]]
ORDER += [(v, s) for s in SEEDS for v in list(VARIANTS)[3:]]
SINUSOIDAL = [v for v in VARIANTS if v.startswith("sinusoidal")]

# Each evaluation: the block length and the model overrides it loads with.
EVALS: dict[str, tuple[int, dict[str, object]]] = {
    "64": (TRAINED, {}),
    "128 extrapolated": (2 * TRAINED, {"max_len": 2 * TRAINED}),
    "64 interpolated": (TRAINED, {"positional_interpolation": 2.0}),
    "128 interpolated": (
        2 * TRAINED,
        {"max_len": 2 * TRAINED, "positional_interpolation": 2.0},
    ),
}


def folder_of(runs: Path, variant: str, seed: int) -> Path:
    return runs / f"{FOLDERS[variant]}-s{seed}"


def record(folder: Path) -> dict[str, object]:
    path = folder / "claims.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def save(folder: Path, data: dict[str, object]) -> None:
    (folder / "claims.json").write_text(json.dumps(data, indent=1))


def train(folder: Path, changes: dict[str, object], seed: int, args: argparse.Namespace) -> None:
    """Train one run, unless its weights are there, and keep its wall time and size."""
    if (folder / "model.safetensors").is_file():
        return
    sets = [f"model.{key}={json.dumps(value)}" for key, value in changes.items()]
    sets += [f"train.seed={seed}", f"train.steps={args.steps}", f"train.threads={args.threads}"]
    sets += [f"train.out_dir={json.dumps(str(folder))}", f"train.save_every={args.steps}"]
    sets += [f"data.data_dir={json.dumps(args.data_dir)}"]
    start = time.perf_counter()
    train_run(RunConfig.load(CONFIG, sets))
    wall = time.perf_counter() - start
    params = sum(p.numel() for p in load_run(folder).model.parameters())
    save(folder, {**record(folder), "wall_s": wall, "params": params})
    print(f"{folder.name}: {wall:.0f} s, {params:,} parameters", flush=True)


def evaluate(folder: Path, names: list[str], data_dir: str) -> None:
    """The validation losses `names` (keys of EVALS) of a run, each measured once."""
    data = record(folder)
    losses = dict(data.get("losses", {}))
    for name in names:
        if name in losses:
            continue
        length, overrides = EVALS[name]
        try:
            run = load_run(folder, overrides=overrides or None)
        except AttnkitError as refused:
            print(f"{folder.name} at {name}: {refused}", flush=True)
            continue
        scores = evaluate_run(
            run, corpus="tinyshakespeare", split="val", data_dir=data_dir, block_size=length
        ).scores
        losses[name] = next(s.value for s in scores if s.name == "loss")
        print(f"{folder.name} at {name}: {losses[name]:.4f}", flush=True)
        save(folder, {**data, "losses": losses})


def spread(values: list[float]) -> str:
    """mean ± sample std (n - 1) and each seed's value, or the values alone under 2 seeds."""
    each = ", ".join(f"{v:.4f}" for v in values)
    if len(values) < 2:
        return f"{each} (1 seed)" if values else "not run"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f} ({each})"


def column(runs: Path, variant: str, key: str, sub: str | None = None) -> list[float]:
    values = []
    for seed in SEEDS:
        data = record(folder_of(runs, variant, seed))
        value = data.get(key, {}).get(sub) if sub else data.get(key)
        if value is not None:
            values.append(float(value))
    return values


def paired(runs: Path, variant: str, name: str) -> list[float]:
    """Each seed's loss on `name` minus its own on the trained blocks of 64."""
    values = []
    for seed in SEEDS:
        losses = record(folder_of(runs, variant, seed)).get("losses", {})
        if name in losses and "64" in losses:
            values.append(losses[name] - losses["64"])
    return values


def tables(runs: Path) -> str:
    dff = [
        "| d_ff | parameters | validation loss, mean ± std (seeds 0, 1, 2) | wall s (mean) |",
        "| --- | ---: | --- | ---: |",
    ]
    for variant in ("d_ff 1x", "d_ff 2x", "d_ff 4x (recipe, learned)", "d_ff 8x"):
        params, walls = column(runs, variant, "params"), column(runs, variant, "wall_s")
        size = f"{int(params[0]):,}" if params else ""
        wall = f"{statistics.mean(walls):.0f}" if walls else ""
        loss = spread(column(runs, variant, "losses", "64"))
        dff.append(f"| {variant} | {size} | {loss} | {wall} |")
    positions = [
        "| positions | validation loss, mean ± std (seeds 0, 1, 2) |",
        "| --- | --- |",
    ]
    for variant in ["d_ff 4x (recipe, learned)", *SINUSOIDAL]:
        label = "learned" if variant.startswith("d_ff") else variant
        positions.append(f"| {label} | {spread(column(runs, variant, 'losses', '64'))} |")
    interpolation = [
        "| model trained on 64 | read on | validation loss, mean ± std (seeds 0, 1, 2) "
        "| minus the loss on 64, seed by seed |",
        "| --- | --- | --- | --- |",
    ]
    for variant in SINUSOIDAL:
        for name in EVALS:
            loss = spread(column(runs, variant, "losses", name))
            change = spread(paired(runs, variant, name)) if name != "64" else ""
            interpolation.append(f"| {variant} | {name} | {loss} | {change} |")
    return "\n\n".join("\n".join(t) for t in (dff, positions, interpolation))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench claims", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--runs", type=Path, default=Path("runs/claims"))
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(FOLDERS.values()),
        default=None,
        help="train only these variants (folder names), in the same order",
    )
    parser.add_argument(
        "--no-train", action="store_true", help="train nothing: measure what is missing, tables"
    )
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    header = opening(f"{args.threads} thread(s) a run, {args.steps} steps, seeds {SEEDS}")
    for variant, seed in ORDER:
        if args.only and FOLDERS[variant] not in args.only:
            continue
        folder = folder_of(args.runs, variant, seed)
        if not args.no_train:
            train(folder, VARIANTS[variant], seed, args)
        if (folder / "model.safetensors").is_file():
            evaluate(folder, list(EVALS) if variant in SINUSOIDAL else ["64"], args.data_dir)
    text = tables(args.runs)
    print("\n" + text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        found = {
            folder.name: record(folder)
            for folder in sorted(args.runs.glob("*-s*"))
            if folder.is_dir()
        }
        args.out.with_suffix(".json").write_text(
            json.dumps({"machine": header, "runs": found}, indent=1)
        )
        args.out.with_suffix(".md").write_text(header + "\n\n" + text + "\n")


if __name__ == "__main__":
    main()
