"""Watching the training loss without waiting for the device each step.

Reading a number off a GPU (`.item()`, `.tolist()`) waits until every queued
kernel has run, so a loop that reads each step's loss keeps the GPU idle while
Python prepares the next step. The step's verdicts therefore stay on the
device: for step s with the summed loss L_s and target tokens N_s,

    bad_s = not finite(L_s) or N_s == 0
    first <- s  and  value <- L_s   at the first bad step (kept: later ones do not overwrite)

From the first bad step on, every update is skipped on the device (the fused
AdamW's `found_inf`, the flag torch's GradScaler uses), so the weights stay as
they were before it, and the
Trainer reads the verdict every `every` steps and before each save and
evaluation, then stops with the step where it went wrong. On a CPU reading
costs nothing, so there `every` is 1 and the run stops at the bad step itself.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from attnkit.errors import AttnkitError
from attnkit.train.stopping import diverged


class LossWatch:
    """The first step whose loss was not finite or that had no target tokens, kept on `device`."""

    def __init__(self, device: torch.device, every: int) -> None:
        self.every = every
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=device)
        self.bad_loss = torch.zeros((), dtype=torch.float64, device=device)
        self.first_empty = torch.full((), -1, dtype=torch.int64, device=device)

    def step(self, step: int, trained: Tensor, tokens: Tensor) -> Tensor:
        """Record step `step`'s summed loss and tokens; its `found_inf`: 1.0 (skip the update)
        from the first bad step on."""
        bad = ~torch.isfinite(trained)
        empty = tokens == 0
        new = bad & (self.first_bad < 0)
        self.first_bad = torch.where(new, step, self.first_bad)
        self.bad_loss = torch.where(new, trained, self.bad_loss)
        self.first_empty = torch.where(empty & (self.first_empty < 0), step, self.first_empty)
        return ((self.first_bad >= 0) | (self.first_empty >= 0)).float()

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def check(self, run_dir: Path, saved_step: int | None) -> None:
        """Raise the error of the first bad step since the run began, if there was one."""
        first_bad, first_empty = torch.stack([self.first_bad, self.first_empty]).tolist()
        if first_empty >= 0 and (first_bad < 0 or first_empty <= first_bad):
            raise AttnkitError(
                f"the training batch of step {first_empty} has no target tokens; check the data"
            )
        if first_bad >= 0:
            raise diverged(float(self.bad_loss), first_bad, run_dir, saved_step)
