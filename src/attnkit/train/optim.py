"""The optimizer and its learning-rate schedules.

AdamW with two parameter groups: weight decay shrinks matrices that mix
features, never biases, norm gains or embeddings (decaying those only fights
their scale, as nanoGPT's `configure_optimizers` notes).

The paper's schedule (section 5.3), for step = 1, 2, ...:

    lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)

a linear warmup then inverse-square-root decay, peaking at step = warmup with
(d_model * warmup)^-0.5. Linear warmup + cosine decay goes from 0 to the peak
in `warmup` steps, then along half a cosine to `min_lr` at the last step.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from attnkit.errors import AttnkitError
from attnkit.nn import AbsolutePositions, TokenEmbedding

EMBEDDINGS = (nn.Embedding, TokenEmbedding, AbsolutePositions)


def no_decay_names(model: nn.Module) -> set[str]:
    """Names of the parameters exempt from weight decay: biases, norms and embeddings.

    A parameter shared by several modules (a tied embedding and output
    projection) is listed under its first name, as `named_parameters` gives it.
    """
    exempt: set[int] = set()
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if isinstance(module, EMBEDDINGS) or "norm" in type(module).__name__.lower():
            exempt.update(id(p) for p in own)
        exempt.update(id(p) for name, p in module.named_parameters(recurse=False) if name == "bias")
    return {name for name, p in model.named_parameters() if id(p) in exempt}


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: decayed matrices, and the exempt rest with weight_decay 0."""
    exempt = no_decay_names(model)
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
) -> torch.optim.AdamW:
    """AdamW over `parameter_groups`; the paper used beta2 0.98 and eps 1e-9.

    The fused kernel updates every tensor in one pass; the default on a CPU is
    a Python loop of several small ops per tensor, which a small model feels.
    """
    fused = all(p.device.type in ("cpu", "cuda") for p in model.parameters())
    return torch.optim.AdamW(
        parameter_groups(model, weight_decay), lr=lr, betas=betas, eps=eps, fused=fused
    )


def paper_rate(step: int, d_model: int, warmup: int) -> float:
    """lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), for step >= 1."""
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def schedule_factor(
    kind: str, *, lr: float, warmup: int, steps: int, min_lr: float = 0.0
) -> Callable[[int], float]:
    """The multiplier of `lr` at optimizer step `step` (1-based), by schedule name.

    inverse-sqrt: the paper's shape scaled to peak at `lr` (with lr =
    (d_model * warmup)^-0.5 it is the paper's schedule exactly); cosine and
    linear: warmup, then decay to `min_lr` at `steps`; constant: warmup, then flat.
    """
    floor = min_lr / lr

    def warm(step: int) -> float:
        return min(1.0, step / warmup) if warmup else 1.0

    def progress(step: int) -> float:
        return min(1.0, max(0.0, (step - warmup) / max(1, steps - warmup)))

    if kind == "inverse-sqrt":
        return lambda step: warmup**0.5 * min(step**-0.5, step * warmup**-1.5)
    if kind == "cosine":
        return lambda step: (
            warm(step)
            if step <= warmup
            else floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress(step)))
        )
    if kind == "linear":
        return lambda step: warm(step) if step <= warmup else 1 - (1 - floor) * progress(step)
    if kind == "constant":
        return warm
    raise AttnkitError(f"unknown schedule {kind!r}; use inverse-sqrt, cosine, linear or constant")


def build_scheduler(
    optimizer: torch.optim.Optimizer, factor: Callable[[int], float]
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR whose k-th optimizer step (k = 1, 2, ...) runs at lr * factor(k).

    LambdaLR evaluates its lambda at 0 before the first step; shifting by one
    makes the first update use the paper's step 1 instead of a wasted zero rate.
    """
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: factor(epoch + 1))
