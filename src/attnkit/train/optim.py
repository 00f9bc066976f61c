"""The optimizer and its learning-rate schedules.

AdamW with two parameter groups: weight decay shrinks matrices that mix
features, never biases or norm gains (decaying those only fights their scale,
as nanoGPT's `configure_optimizers` notes), and embeddings only when asked:
nanoGPT decays every matrix, its tied token table and its position table too.

The paper's schedule (section 5.3), for step = 1, 2, ...:

    lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)

a linear warmup then inverse-square-root decay, peaking at step = warmup with
(d_model * warmup)^-0.5. Linear warmup + cosine decay goes from 0 to the peak
in `warmup` steps, then along half a cosine to `min_lr` at the last step.

A run bounded by wall-clock time rather than steps can stretch the decay over
its budget instead (`TimeBudget`), as budget-aware training recipes do
(Li et al. 2020, "Budgeted Training"; Geiping & Goldstein 2022, "Cramming"):
the last step is re-estimated at every step as the one the budget reaches at
the pace so far, so the rate arrives at `min_lr` as the time runs out.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch
from torch import nn

from attnkit.errors import AttnkitError
from attnkit.nn import AbsolutePositions, TokenEmbedding
from attnkit.train.run_config import TrainSection

log = logging.getLogger(__name__)

EMBEDDINGS = (nn.Embedding, TokenEmbedding, AbsolutePositions)


def no_decay_names(model: nn.Module, decay_embeddings: bool = False) -> set[str]:
    """Names of the parameters exempt from weight decay: biases, norms and (unless
    `decay_embeddings`) embeddings.

    A parameter shared by several modules (a tied embedding and output
    projection) is listed under its first name, as `named_parameters` gives it.
    """
    exempt: set[int] = set()
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        embedding = isinstance(module, EMBEDDINGS) and not decay_embeddings
        if embedding or "norm" in type(module).__name__.lower():
            exempt.update(id(p) for p in own)
        exempt.update(id(p) for name, p in module.named_parameters(recurse=False) if name == "bias")
    return {name for name, p in model.named_parameters() if id(p) in exempt}


def parameter_groups(
    model: nn.Module, weight_decay: float, decay_embeddings: bool = False
) -> list[dict]:
    """Two AdamW groups: decayed matrices, and the exempt rest with weight_decay 0."""
    exempt = no_decay_names(model, decay_embeddings)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for n, p in params if n not in exempt], "weight_decay": weight_decay},
        {"params": [p for n, p in params if n in exempt], "weight_decay": 0.0},
    ]


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
    decay_embeddings: bool = False,
) -> torch.optim.AdamW:
    """AdamW over `parameter_groups`; the paper used beta2 0.98 and eps 1e-9.

    The fused kernel updates every tensor in one pass; the default on a CPU is
    a Python loop of several small ops per tensor, which a small model feels.
    """
    fused = all(p.device.type in ("cpu", "cuda") for p in model.parameters())
    return torch.optim.AdamW(
        parameter_groups(model, weight_decay, decay_embeddings),
        lr=lr,
        betas=betas,
        eps=eps,
        fused=fused,
    )


def paper_rate(step: int, d_model: int, warmup: int) -> float:
    """lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), for step >= 1."""
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def schedule_factor(
    kind: str, *, lr: float, warmup: int, steps: int, min_lr: float = 0.0
) -> Callable[..., float]:
    """The multiplier of `lr` at optimizer step `step` (1-based), by schedule name.

    inverse-sqrt: the paper's shape scaled to peak at `lr` (with lr =
    (d_model * warmup)^-0.5 it is the paper's schedule exactly); cosine and
    linear: warmup, then decay to `min_lr` at `steps`; constant: warmup, then flat.
    The returned function takes `(step, last=steps)`: `last` moves the end of
    the decay (a `TimeBudget.last_step`).
    """
    floor = min_lr / lr

    def warm(step: int) -> float:
        return min(1.0, step / warmup) if warmup else 1.0

    def progress(step: int, last: float) -> float:
        return min(1.0, max(0.0, (step - warmup) / max(1.0, last - warmup)))

    def cosine(step: int, last: float = steps) -> float:
        if step <= warmup:
            return warm(step)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress(step, last)))

    def linear(step: int, last: float = steps) -> float:
        return warm(step) if step <= warmup else 1 - (1 - floor) * progress(step, last)

    if kind == "inverse-sqrt":
        return lambda step, last=steps: warmup**0.5 * min(step**-0.5, step * warmup**-1.5)
    if kind == "cosine":
        return cosine
    if kind == "linear":
        return linear
    if kind == "constant":
        return lambda step, last=steps: warm(step)
    raise AttnkitError(f"unknown schedule {kind!r}; use inverse-sqrt, cosine, linear or constant")


class TimeBudget:
    """The last step of a decay that should end when `seconds` of wall time are spent.

    After step k, t seconds into the session that began after step s0 (`observe`),
    the k - s0 steps done put the budget's end at step s0 + (k - s0) * seconds / t,
    capped by `steps`: the pace of the steps observed so far. Without warmup the
    decay's progress is then the fraction of the budget spent; evaluations and
    a slow start count as spent time, so the rate is never late to reach its
    floor. The session's fraction done, (s - s0) / (end - s0), never goes back:
    when the pace quickens (a slow first step, a machine that frees up) the end
    moves later at most in proportion to the steps taken, so the rate never
    rises again. A resumed run gets a fresh budget: its decay stretches over the
    new session.

    The seconds come from the trainer's `Stopping`, agreed by all ranks, so every rank of a
    data-parallel run sets the same rate and the replicas stay equal.
    """

    def __init__(self, seconds: float, steps: int):
        self.seconds, self.steps = seconds, steps
        self.first_step = 0
        self.observed: tuple[int, float] | None = None  # (step, seconds into the session)
        self.previous: tuple[int, float] | None = None  # (step, the end it was given)

    def begin(self, step: int) -> None:
        """Start a session at optimizer step `step` (0 for a new run)."""
        self.first_step, self.observed, self.previous = step, None, None

    def observe(self, step: int, seconds: float) -> None:
        """Step `step` ended `seconds` into the session."""
        self.observed = (step, seconds)

    def last_step(self, step: int) -> float:
        """The step the budget ends at, for the rate of step `step`."""
        if self.observed is None:
            return self.steps
        observed, spent = self.observed
        done = observed - self.first_step
        if spent <= 0 or done <= 0:
            return self.steps
        last = min(self.steps, self.first_step + done * self.seconds / spent)
        if self.previous is not None:  # keep (step - s0) / (last - s0) from going back
            before, its_last = self.previous
            s0 = self.first_step
            last = min(last, s0 + (step - s0) * (its_last - s0) / (before - s0))
        self.previous = (step, last)
        return last


def build_scheduler(
    optimizer: torch.optim.Optimizer, factor: Callable[[int], float]
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR whose k-th optimizer step (k = 1, 2, ...) runs at lr * factor(k).

    LambdaLR evaluates its lambda at 0 before the first step; shifting by one
    makes the first update use the paper's step 1 instead of a wasted zero rate.
    """
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: factor(epoch + 1))


def optimization(
    model: nn.Module, c: TrainSection
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR, TimeBudget | None]:
    """The optimizer, its schedule and (`decay_over = "minutes"`) the time budget that ends
    the schedule, as the [train] section `c` sets them."""
    optimizer = build_optimizer(
        model, c.lr, c.weight_decay, (c.beta1, c.beta2), c.eps, c.decay_embeddings
    )
    factor = schedule_factor(c.schedule, lr=c.lr, warmup=c.warmup, steps=c.steps, min_lr=c.min_lr)
    if c.warmup > c.steps and c.decay_over == "steps":
        log.warning(
            "train.warmup %d is longer than the run (train.steps %d): the rate rises to "
            "%.3g at most, never reaching train.lr %g; lower train.warmup if that is not meant",
            c.warmup,
            c.steps,
            c.lr * factor(c.steps),
            c.lr,
        )
    budget = TimeBudget(60 * c.max_minutes, c.steps) if c.decay_over == "minutes" else None
    scheduler = build_scheduler(
        optimizer, factor if budget is None else lambda step: factor(step, budget.last_step(step))
    )
    return optimizer, scheduler, budget
