"""Stopping a run before `train.steps`, cleanly: the step finishes, a checkpoint is saved and
`Trainer.fit` returns how the run ended.

    interrupted    Ctrl-C or `Trainer.request_stop`
    terminated     SIGTERM, what `timeout`, SLURM, Kubernetes and docker send to stop a job
    time-limit     `train.max_minutes` of this session spent

A second Ctrl-C or SIGTERM aborts at once, without saving. The command line
exits with 128 + the signal's number after a stop by a signal (130 for Ctrl-C,
143 for SIGTERM), as a shell reports a process the signal ended, and prints
`resume_command`: the command that continues the run, with the `--set`
options it was started with.

Early stopping (`eval.patience`) is decided by the evaluation, on the `BestMetric` it keeps;
a request to stop overrides it.
Every rank must stop at the same step, whichever of them was asked to, so the ranks'
reasons are summed before any of them acts on them. The session's clock is agreed in the
same all-reduce (the ranks' mean), and the time limit is read on it: so is the time budget
that sets the rate (`attnkit.train.optim.TimeBudget`), since ranks that read their own
clocks would set rates that differ a little, and their replicas would drift apart.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnkit.embeddings.glove import Glove
from attnkit.embeddings.word2vec import Word2Vec
from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel
from attnkit.train import distributed as dist

log = logging.getLogger(__name__)

# How each signal that stops a run cleanly ends it, and the exit status that reports it.
STOP_SIGNALS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}
EXIT_STATUS = {stopped: 128 + int(signum) for signum, stopped in STOP_SIGNALS.items()}
_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


@dataclass
class TrainResult:
    """How `Trainer.fit` ended: the model, the last step, why, and the records it wrote."""

    model: TransformerModel | Word2Vec | Glove  # what the run trained: a Transformer, or vectors
    step: int
    stopped: str
    """`finished`, `early-stopped`, `time-limit`, `interrupted` or `terminated` (SIGTERM)."""
    run_dir: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    best: float | None = None


@dataclass
class BestMetric:
    """The best value of the validation metric so far, and the evaluations since it.

    `update` takes each evaluation's value: a better one (lower for a loss or an error
    rate, `lower_is_better`) becomes the best, any other counts one more evaluation
    without improvement; after `patience` of those in a row the run stops early
    (`exhausted`; patience 0 never stops).
    """

    lower_is_better: bool
    patience: int = 0
    best: float | None = None
    bad_evals: int = 0

    def update(self, value: float) -> bool:
        """Whether `value` is the best so far, which it then becomes."""
        better = self.best is None or (
            value < self.best if self.lower_is_better else value > self.best
        )
        if better:
            self.best, self.bad_evals = value, 0
        else:
            self.bad_evals += 1
        return better

    @property
    def exhausted(self) -> bool:
        return self.patience > 0 and self.bad_evals >= self.patience


def diverged(loss: float, step: int, run_dir: Path, saved_step: int | None) -> AttnkitError:
    """The error of a training loss that became NaN or infinite at `step`, before the update:
    what is left (the checkpoint of `saved_step`, or none yet) and what to do."""
    stop = f"the training loss became {loss} at step {step}, so the run stopped before updating"
    fix = "lower train.lr, keep train.clip_norm on or use bf16"
    if saved_step is None:
        return AttnkitError(
            f"{stop} the weights; no checkpoint was saved yet in {run_dir}: {fix}, then start again"
        )
    return AttnkitError(
        f"{stop} the weights; the last checkpoint in {run_dir}, of step {saved_step}, is intact: "
        f"{fix}, then resume"
    )


def resume_command(config: str, overrides: Sequence[str] = ()) -> str:
    """The command that continues a run started as `attnkit train CONFIG --set ...`."""
    sets = [arg for item in overrides for arg in ("--set", item)]
    return shlex.join(["attnkit", "train", config, *sets, "--resume"])


class Stopping:
    """The requests to stop and the clock of one training session.

    `resume_command` is what the log line of a stop tells to run next.
    """

    def __init__(self, max_minutes: float, resume_command: str = "Trainer.fit(resume=True)"):
        self.max_minutes = max_minutes
        self.resume_command = resume_command
        self.requested = False
        self.terminated = False
        self.start = time.perf_counter()
        self.seconds = 0.0
        """Seconds into the session when the last step ended (`after`), the same on every rank."""

    def begin(self) -> None:
        """Start the session's clock."""
        self.start = time.perf_counter()
        self.seconds = 0.0

    @contextlib.contextmanager
    def on_signals(self, step: Callable[[], int]) -> Iterator[None]:
        """First Ctrl-C or SIGTERM: finish the step under way (`step()` are done), save and
        stop; a second one aborts at once. Signals reach only the main thread; elsewhere this
        does nothing."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: Any) -> None:
            name = _NAMES[signum]
            if self.requested:
                log.warning("%s again: stopping at once, without saving", name)
                if signum == signal.SIGINT:
                    raise KeyboardInterrupt
                raise SystemExit(EXIT_STATUS["terminated"])
            log.warning("%s: finishing step %d, saving, then stopping", name, step() + 1)
            self.requested = True
            self.terminated = signum == signal.SIGTERM

        previous = {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}
        try:
            yield
        finally:
            for signum, action in previous.items():
                signal.signal(signum, action)

    @property
    def minutes(self) -> float:
        """Minutes since this session's loop began (`begin`), evaluations included."""
        return (time.perf_counter() - self.start) / 60

    def after(self, step: int, device: torch.device, early: str | None) -> str | None:
        """How the run ends after `step` (None: it goes on), the same on every rank; `early` is
        the evaluation's 'early-stopped' or None."""
        seconds = time.perf_counter() - self.start
        stop, terminated = self.requested, self.terminated
        if dist.is_active():  # one all-reduce (NCCL: on device): the reasons and the clock
            flags = torch.tensor(
                [float(stop), float(terminated), seconds], dtype=torch.float64, device=device
            )
            summed = dist.all_reduce_sum(flags).tolist()
            stop, terminated = summed[0] > 0, summed[1] > 0
            seconds = summed[2] / dist.world_size()
        self.seconds = seconds
        time_up = self.max_minutes > 0 and seconds > 60 * self.max_minutes
        if stop:
            stopped = "terminated" if terminated else "interrupted"
            log.info(
                "stopping at step %d (%s): saving; continue with: %s",
                step,
                stopped,
                self.resume_command,
            )
            return stopped
        if time_up and not early:
            log.info("train.max_minutes %g spent at step %d", self.max_minutes, step)
            return "time-limit"
        return early
