"""Decoding chosen on validation, then test decoded once: the last part of a GPU recipe's check.

    python -m bench.choose_decoding RUN --device cuda [--averages 1 5] [--probe-beam 4]
        [--beams 1 4 8] [--length-penalties 1.0 1.2 1.4] [--batch-size 256] [--out FILE.json]

A run folder holds its final model (model.safetensors: the mean of its last `average_last`
step checkpoints, as the paper averaged the last 5) and the step checkpoints it kept. Three
stages, each on the library (`attnkit.evaluation.run`), with the model loaded once:

1. Checkpoint averaging: for each k of --averages, the mean of the last k kept checkpoints
   (k = 1: the last alone; `attnkit.train.checkpoint.average_weights`), decoded on the
   validation split with beam --probe-beam and length penalty 1.
2. Beam size and length penalty: every pair of --beams and --length-penalties (greedy once:
   the penalty divides beam scores only) on the weights stage 1 chose.
3. The test split decoded once, with the weights and the setting chosen, and scored:
   BLEU cased and lowercased and chrF with sacreBLEU's signatures, or WER and PER.

Validation chooses by lowercased BLEU (higher) for translation, by PER and then WER (lower)
for a set scored by error rates (CMUdict); a tie keeps the earlier candidate: fewer
checkpoints, smaller beam, the penalty listed first. Test scores choose nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnkit.errors import AttnkitError
from attnkit.evaluation.run import EvalSet, Evaluation, read_eval_set, score_run
from attnkit.generation import GenerationConfig
from attnkit.run import Run, load_run
from attnkit.train.checkpoint import average_weights
from attnkit.weights import load_weights

LOWERCASED_BLEU = "BLEU (lowercased)"


@dataclass(frozen=True)
class Trial:
    """One decoding of the validation split: which weights, which setting, what it scored."""

    weights: str
    beam: int
    length_penalty: float
    scores: dict[str, float]
    seconds: float

    def key(self) -> tuple[float, ...]:
        """Smaller is better: -lowercased BLEU, or (PER, WER)."""
        if "PER" in self.scores:
            return (self.scores["PER"], self.scores["WER"])
        return (-self.scores[LOWERCASED_BLEU],)

    def line(self) -> str:
        shown = "  ".join(f"{name} {value:.2f}" for name, value in self.scores.items())
        return (
            f"val  {self.weights:<24} beam {self.beam:<2} length penalty {self.length_penalty:<4}"
            f"  {shown}  ({self.seconds:.1f} s)"
        )


def weight_sets(run: Run, averages: Sequence[int]) -> dict[str, list[Path]]:
    """The candidate weights by name: the mean of the last k kept checkpoints for each k
    (fewer where fewer were kept, each distinct set once); the run's own model.safetensors
    alone where it kept none."""
    steps = run.folder.saved_steps()
    if not steps:
        return {"the run's model": [run.folder.weights]}
    sets: dict[str, list[Path]] = {}
    for k in averages:
        chosen = steps[-k:]
        name = (
            f"last checkpoint ({chosen[0]})"
            if len(chosen) == 1
            else f"mean of last {len(chosen)} ({chosen[0]}-{chosen[-1]})"
        )
        sets.setdefault(name, [run.folder.step_weights(s) for s in chosen])
    return sets


def use_weights(run: Run, paths: list[Path], scratch: Path, device: str) -> None:
    """Load the mean of `paths` into the run's model in place (through a file, so that
    `load_weights` checks it as it checks any run's weights)."""
    from safetensors.torch import save_file

    mean = scratch / "candidate.safetensors"
    save_file(average_weights(paths), str(mean))
    load_weights(run.model, mean, device)


def decode(run: Run, data: EvalSet, beam: int, penalty: float, args) -> tuple[Evaluation, float]:
    """The run's scores on `data` with this beam and length penalty, and the seconds taken."""
    generation = GenerationConfig(
        max_new_tokens=args.max_new_tokens or run.model.config.max_len - 1,
        num_beams=beam,
        length_penalty=penalty,
        cache_implementation=args.cache,
    )
    start = time.perf_counter()
    evaluation = score_run(run, data, generation, batch_size=args.batch_size)
    return evaluation, time.perf_counter() - start


def choose(args: argparse.Namespace) -> dict:
    """Stages 1 to 3 of the module's docstring; what was tried, chosen and scored."""
    run = load_run(args.run_dir, args.device)
    if run.model.config.shape != "encoder-decoder":
        raise AttnkitError(
            f"{args.run_dir} is a {run.model.config.shape} model; decoding settings are chosen "
            "for a translation or G2P run (an encoder-decoder)"
        )
    sets = {"data_dir": args.data_dir, "limit": args.limit, "batch_size": args.batch_size}
    val = read_eval_set(run, split="val", **sets)
    test = read_eval_set(run, split="test", **sets)
    print(f"validation: {val.description}; test: {test.description}")
    trials: list[Trial] = []

    def trial(name: str, beam: int, penalty: float) -> Trial:
        evaluation, seconds = decode(run, val, beam, penalty, args)
        scores = {s.name: s.value for s in evaluation.scores if s.name != "length ratio"}
        done = Trial(name, beam, penalty, scores, seconds)
        print(done.line(), flush=True)
        trials.append(done)
        return done

    candidates = weight_sets(run, args.averages)
    with tempfile.TemporaryDirectory() as scratch:
        for name, paths in candidates.items():
            use_weights(run, paths, Path(scratch), args.device)
            trial(name, args.probe_beam, 1.0)
        weights = min(trials, key=Trial.key).weights
        use_weights(run, candidates[weights], Path(scratch), args.device)
        for beam in args.beams:
            for penalty in args.length_penalties if beam > 1 else (1.0,):
                tried = {(t.weights, t.beam, t.length_penalty) for t in trials}
                if (weights, beam, penalty) not in tried:
                    trial(weights, beam, penalty)
        best = min((t for t in trials if t.weights == weights), key=Trial.key)
        print(
            f"chosen on validation: {best.weights}, beam {best.beam}, "
            f"length penalty {best.length_penalty}"
        )
        evaluation, seconds = decode(run, test, best.beam, best.length_penalty, args)
    print(f"test, decoded once ({seconds:.1f} s): {evaluation.description}")
    print(evaluation.table())
    if args.output:
        Path(args.output).write_text("\n".join(evaluation.hypotheses) + "\n", encoding="utf-8")
    return {
        "run": str(args.run_dir),
        "device": device_name(args.device),
        "validation": val.description,
        "trials": [dataclasses.asdict(t) for t in trials],
        "chosen": {
            "weights": best.weights,
            "beam": best.beam,
            "length_penalty": best.length_penalty,
        },
        "test": test.description,
        "test_scores": [
            {"name": s.name, "value": s.value, "signature": s.signature} for s in evaluation.scores
        ],
    }


def device_name(device: str) -> str:
    """The GPU's name for a CUDA device, else the device as given."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return device


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.choose_decoding", description=__doc__)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a trained translation or G2P run folder")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (default cpu)")
    p.add_argument(
        "--averages", type=int, nargs="+", default=[1, 5],
        help="the candidates of stage 1: the mean of the last k checkpoints, for each k",
    )  # fmt: skip
    p.add_argument("--probe-beam", type=int, default=4, help="the beam of stage 1 (default 4)")
    p.add_argument("--beams", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--length-penalties", type=float, nargs="+", default=[1.0, 1.2, 1.4])
    p.add_argument(
        "--cache",
        choices=("auto", "dynamic", "static"),
        default="auto",
        help="the KV cache (GenerationConfig.cache_implementation; default auto)",
    )
    p.add_argument("--batch-size", type=int, default=128, help="sentences decoded together")
    p.add_argument("--max-new-tokens", type=int, default=0, help="default: max_len - 1")
    p.add_argument("--data-dir", help="folder holding <corpus>/<files> (default: the run's)")
    p.add_argument("--limit", type=int, default=0, help="only the first N of each split")
    p.add_argument("--output", help="also write the test translations here")
    p.add_argument("--out", help="write what was tried, chosen and scored here, as JSON")
    args = p.parse_args(argv)
    if args.max_new_tokens < 0:
        p.error("--max-new-tokens takes a whole number, 0 for the model's max_len - 1")
    for name in ("averages", "beams"):
        if min(getattr(args, name)) < 1:
            p.error(f"--{name} takes whole numbers of at least 1")
    if args.probe_beam < 1:
        p.error("--probe-beam takes a whole number of at least 1")
    result = choose(args)
    print(f"device: {result['device']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
