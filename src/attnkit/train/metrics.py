"""What a run measures as it trains: the records of its metrics.jsonl.

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

import torch

from attnkit.data.batch import Batch
from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel
from attnkit.train import distributed as dist
from attnkit.train.objectives import Objective

log = logging.getLogger(__name__)

Metric = Callable[[TransformerModel], dict[str, float]]
"""An extra validation metric: the model (eval mode, no grad) -> named values; which are better
lower, as error rates are, is `EvalSection.lower_is_better`'s to say."""


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
    objective: Objective,
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
