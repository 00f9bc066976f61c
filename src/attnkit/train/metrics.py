"""What a run measures as it trains: the records of its metrics.jsonl, and the [eval] section.

Every `train.log_every` steps, over the steps since the last such record:

    train_loss = (summed loss) / (target tokens),   tokens_per_s
    train_aux_loss = (summed auxiliary losses) / (target tokens)   (a mixture of experts'
                     load balancing, guided attention; each weighted)

Every `eval.every` steps, over the validation batches:

    val_loss = sum of -log p(target token) / (target tokens),   val_ppl = exp(val_loss)

and the task's extra `Metric`s (BLEU, exact match, ...), computed on rank 0;
the Trainer adds `minutes`, the time of this session when the evaluation was
due (the clock `train.max_minutes` reads), so runs compare by time as by step.
The sums are over every rank, so under DDP both are those of the global batch.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from attnkit.checks import each, non_negative, positive
from attnkit.data.batch import Batch
from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel
from attnkit.train import distributed as dist
from attnkit.train.objectives import TrainingObjective

log = logging.getLogger(__name__)

Metric = Callable[[TransformerModel], dict[str, float]]
"""An extra validation metric: the model (eval mode, no grad) -> named values; which are better
lower, as error rates are, is `EvalSection.lower_is_better`'s to say."""

# The metrics that are better lower; every other (BLEU, exact match) is better higher. The one
# place that says so: `EvalSection.lower_is_better`, which the Trainer's best checkpoint and
# patience read.
LOWER_IS_BETTER = ("val_loss", "val_ppl", "per", "wer")


@dataclass(frozen=True)
class EvalSection:
    """Validation during training.

    every: steps between evaluations (validation loss and perplexity).
    metric: what picks the best checkpoint and drives early stopping: `val_loss`,
        `val_ppl`, or a metric a task adds (`bleu`, or the phoneme and word error
        rates `per` and `wer`, for translation; `exact_match` for the demo;
        `reward_margin` and `reward_accuracy` for preference, whose `val_loss` is
        DPO's). The validation loss and perplexity and the error rates are better
        lower (`LOWER_IS_BETTER`), the rest higher.
    patience: evaluations without improvement before stopping; 0 never stops.
    decode_examples: held-out examples decoded greedily for the task's metric
        (BLEU on validation pairs for translation, or WER and PER on validation
        sources with every listed target accepted; exact match for the demo).
    max_batches: validation batches for the loss; 0 uses them all.
    """

    every: int = 500
    metric: str = "val_loss"
    patience: int = 0
    decode_examples: int = 200
    max_batches: int = 0

    def __post_init__(self) -> None:
        each(positive, "eval", self, "every", "decode_examples")
        each(non_negative, "eval", self, "patience", "max_batches")

    @property
    def lower_is_better(self) -> bool:
        """Whether a smaller `metric` is a better one (a loss, an error rate)."""
        return self.metric in LOWER_IS_BETTER


class Interval:
    """The training sums since the last record (`LossTerms.recorded`), and when it began.

    The sums stay on the training device until the record is made: reading them
    there waits for the device, which a record may do and a step should not.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.sums = torch.zeros(6, dtype=torch.float64, device=device)
        self.start = time.perf_counter()
        self.steps = 0

    def add(self, sums: torch.Tensor) -> None:
        """Add one step's sums, in the order of `LossTerms.recorded`."""
        self.sums += sums
        self.steps += 1

    def close(self, step: int, steps: int, lr: float) -> dict[str, float]:
        """The record of the interval that ends at `step` (also logged); a new one begins."""
        loss, tokens, aux, sequence, reward, sources = self.sums.tolist()
        elapsed = time.perf_counter() - self.start
        record = {
            "step": step,
            "train_loss": loss / tokens,
            "lr": lr,
            "tokens_per_s": tokens / max(elapsed, 1e-9),
        }
        if aux:  # the weighted auxiliary losses (load balancing, guided attention), per token
            record["train_aux_loss"] = aux / tokens
        if sources:  # sequence-level training: its weighted loss and mean reward
            record["train_sequence_loss"] = sequence / tokens
            record["train_reward"] = reward / sources
        reward_text = f"  reward {record['train_reward']:.4f}" if "train_reward" in record else ""
        log.info(
            "step %d/%d  loss %.4f  lr %.3g  %.0f tokens/s%s",
            step,
            steps,
            record["train_loss"],
            lr,
            record["tokens_per_s"],
            reward_text,
        )
        self.start = time.perf_counter()
        self.sums.zero_()
        self.steps = 0
        return record


@torch.no_grad()
def validate(
    model: TransformerModel,
    objective: TrainingObjective,
    val_data: Iterable[Batch] | None,
    metrics: Sequence[Metric],
    *,
    device: torch.device,
    seed: int,
    max_batches: int,
    autocast: Callable[[], contextlib.AbstractContextManager],
    is_main: bool,
) -> dict[str, float]:
    """Validation loss and perplexity over `val_data` (its first `max_batches`; 0: all of it),
    plus the extra metrics; `model` is back in its training mode afterwards."""
    was_training = model.training
    model.eval()
    result: dict[str, float] = {}
    # A fixed seed, forked so evaluation neither depends on nor disturbs the training RNG
    # (the masked-LM objective draws its masks at random).
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        torch.manual_seed(seed)
        if val_data is not None:
            sums = torch.zeros(2, dtype=torch.float64, device=device)
            for i, batch in enumerate(val_data):
                if max_batches and i >= max_batches:
                    break
                with autocast():
                    terms = objective(model, batch.to(device))
                sums += torch.stack([terms.nll.double(), terms.tokens.double()])
            nll, tokens = dist.all_reduce_sum(sums).tolist()
            if tokens == 0:
                raise AttnkitError("the validation data yields no target tokens; check it")
            result["val_loss"] = nll / tokens
            result["val_ppl"] = math.exp(min(nll / tokens, 700.0))
        extra: dict[str, float] = {}
        if is_main:
            for metric in metrics:
                extra.update(metric(model))
        result.update(dist.broadcast_object(extra))
    model.train(was_training)
    return result
