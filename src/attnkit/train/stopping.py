"""Stopping a run before `train.steps`, cleanly: the step finishes, a checkpoint is saved and
`Trainer.fit` returns how the run ended.

    interrupted    Ctrl-C or `Trainer.request_stop` (a second Ctrl-C aborts at once)
    time-limit     `train.max_minutes` of this session spent

Early stopping (`eval.patience`) is decided by the evaluation; a request to stop overrides it.
Every rank must stop at the same step, whichever of them was asked to or ran out of time
first, so the ranks' reasons are summed before any of them acts on them.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from attnkit.train import distributed as dist

log = logging.getLogger(__name__)


class Stopping:
    """The requests to stop and the clock of one training session."""

    def __init__(self, max_minutes: float) -> None:
        self.max_minutes = max_minutes
        self.requested = False
        self.start = time.perf_counter()

    def begin(self) -> None:
        """Start the session's clock."""
        self.start = time.perf_counter()

    @contextlib.contextmanager
    def on_sigint(self, step: Callable[[], int]) -> Iterator[None]:
        """First Ctrl-C: finish the step under way (`step()` are done), save and stop; a second
        one aborts at once. Signals reach only the main thread; elsewhere this does nothing."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: Any) -> None:
            if self.requested:
                raise KeyboardInterrupt
            log.warning("Ctrl-C: finishing step %d, saving, then stopping", step() + 1)
            self.requested = True

        previous = signal.signal(signal.SIGINT, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def after(self, step: int, device: torch.device, early: str | None) -> str | None:
        """How the run ends after `step` (None: it goes on), the same on every rank; `early` is
        the evaluation's 'early-stopped' or None."""
        seconds = time.perf_counter() - self.start
        time_up = self.max_minutes > 0 and seconds > 60 * self.max_minutes
        flags = torch.tensor([float(self.requested), float(time_up)], device=device)
        stop, time_up = (dist.all_reduce_sum(flags) > 0).tolist()
        if stop:
            log.info("stopped at step %d on request; resume with --resume", step)
            return "interrupted"
        if time_up and not early:
            log.info("train.max_minutes %g spent at step %d", self.max_minutes, step)
            return "time-limit"
        return early
