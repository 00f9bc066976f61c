"""The cost of training beyond teacher forcing: scheduled sampling and sequence-level steps.

    python -m bench exposure --run runs/multi30k_de_en --steps 6 --reps 3

On the Multi30k recipe's model (a trained run's weights and tokenizer, so that
decoding stops where a trained model stops) and its first training batches of
4,096 tokens, one optimizer step (forward, backward, AdamW) of each objective
runs alternately with a teacher-forced step (bench.harness). Reported: milliseconds
per step of each and the cost relative to teacher forcing (the issue's bound for
scheduled sampling is 2.2x), target tokens per second, and for the sequence-level
steps the tokens decoded per second by `generate` on the KV cache inside the step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from attnkit import recipes
from attnkit.generation import GenerateOutput
from attnkit.train.objectives import Objective, TranslationObjective
from attnkit.train.rewards import SentenceReward
from attnkit.train.run_config import RunConfig
from attnkit.train.scheduled_sampling import ScheduledSampling, ScheduledSamplingSection
from attnkit.train.sequence_level import SequenceLevel, SequenceLossSection
from attnkit.train.tasks import build_task
from bench.harness import Result, alternate, finish, opening

RECIPE = recipes.path("multi30k_de_en")


def objectives(tokenizer: object) -> dict[str, Objective]:
    base = TranslationObjective(0.1)
    mixed = {"decay": "constant", "k": 0.75}
    return {
        "scheduled sampling, argmax, first pass without gradient": ScheduledSampling(
            base, ScheduledSamplingSection(**mixed)
        ),
        "scheduled sampling, softmax, gradient through both passes": ScheduledSampling(
            base, ScheduledSamplingSection(**mixed, mix="softmax", first_pass_grad=True)
        ),
        "scheduled sampling, 2 parallel passes, argmax": ScheduledSampling(
            base, ScheduledSamplingSection(**mixed, passes=2)
        ),
        "self-critical, 1 sample + greedy": SequenceLevel(
            base, SequenceLossSection(kind="self-critical", candidates=1), tokenizer
        ),
        "minimum risk, 4 samples": SequenceLevel(
            base, SequenceLossSection(kind="risk", candidates=4), tokenizer
        ),
        "minimum risk, the 4 best of a beam of 4": SequenceLevel(
            base, SequenceLossSection(kind="risk", candidates=4, search="beam"), tokenizer
        ),
    }


class DecodeClock:
    """Time and new tokens of every `decode` a sequence-level objective makes."""

    def __init__(self, objective: SequenceLevel) -> None:
        self.seconds, self.tokens = 0.0, 0
        decode = objective.decode

        def timed(*args, **kwargs) -> GenerateOutput:
            start = time.perf_counter()
            out = decode(*args, **kwargs)
            self.seconds += time.perf_counter() - start
            width = out.sequences.shape[1] - out.prefix_length
            # Each row's tokens up to its EOS, which counts if it was decoded.
            self.tokens += sum(min(len(row) + 1, width) for row in out.new_tokens())
            return out

        objective.decode = timed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench exposure", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--run", default="runs/multi30k_de_en", help="a trained recipe run")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per measurement")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    if not (Path(args.run) / "model.safetensors").is_file():
        raise SystemExit(f"{args.run} holds no trained run; train {RECIPE} first or pass --run")
    torch.set_num_threads(args.threads)
    header = opening(f"{args.threads} threads, {args.steps} steps x {args.reps} reps, {args.run}")
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [f"train.out_dir={tmp}/run", f"train.init_from={args.run}"]
        setup = build_task(RunConfig.load(RECIPE, overrides))
    batches = [b for _, b in zip(range(args.steps), setup.train_data, strict=False)]
    tokens = sum(int(b.tgt_mask[:, 1:].sum()) for b in batches)
    model = setup.model.train()
    # A tiny rate: each side runs the same steps on (almost) the same weights.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7)

    spent: dict[int, float] = {}  # each objective's seconds in all, warm-up included

    def side(objective: Objective):
        def run() -> float:
            torch.manual_seed(0)
            start = time.perf_counter()
            for batch in batches:
                terms = objective(model, batch)
                (terms.total / terms.tokens).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            seconds = time.perf_counter() - start
            spent[id(objective)] = spent.get(id(objective), 0.0) + seconds
            return seconds / len(batches) * 1000

        return run

    teacher = side(TranslationObjective(0.1))
    results = []
    for name, objective in objectives(setup.tokenizer).items():
        clock = DecodeClock(objective) if isinstance(objective, SequenceLevel) else None
        ours, peer = alternate(side(objective), teacher, reps=args.reps, swap=True)
        extra: dict[str, float | str] = {
            "cost vs teacher forcing": f"{statistics.median(ours) / statistics.median(peer):.2f}x",
            "target tokens/s": round(tokens / len(batches) / statistics.median(ours) * 1000),
            "teacher-forced tokens/s": round(
                tokens / len(batches) / statistics.median(peer) * 1000
            ),
        }
        if clock is not None:
            extra["decoded tokens/s"] = round(clock.tokens / clock.seconds)
            extra["share of the step decoding"] = round(clock.seconds / spent[id(objective)], 2)
        results.append(
            Result(
                name, "ms/step", ours, peer, "teacher forcing", higher_is_better=False, extra=extra
            )
        )
    results.append(reward_cost(setup.tokenizer, batches))
    finish(results, header, args.out)


def reward_cost(tokenizer: object, batches: list) -> Result:
    """Microseconds per sentence of sacreBLEU's sentence BLEU, on the batches' references
    against themselves cut by two words (what a step scores K + 1 times per source)."""
    references = [
        tokenizer.decode(row[mask][1:-1].tolist())
        for batch in batches
        for row, mask in zip(batch.tgt, batch.tgt_mask, strict=True)
    ]
    hypotheses = [" ".join(text.split()[:-2]) for text in references]
    reward = SentenceReward("bleu")

    def run() -> float:
        start = time.perf_counter()
        reward(hypotheses, references)
        return (time.perf_counter() - start) / len(references) * 1e6

    (ours,) = alternate(run, reps=3)
    extra = {"sentences": len(references)}
    return Result("sentence BLEU reward (sacreBLEU)", "us/sentence", ours, extra=extra)


if __name__ == "__main__":
    main()
