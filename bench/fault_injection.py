"""Fault injection: training killed with SIGKILL in the middle of its checkpoint writes.

    python -m bench fault --iterations 50

Each iteration runs `attnkit train` in a child process on a tiny digit-reversal
run that saves a checkpoint at every step (with `--resume` once the run folder
holds one), waits for the child to begin its k-th checkpoint write of the
session (k drawn from 1 to 3), and kills it with SIGKILL after a random part of
the time a write takes: mostly inside the write, sometimes just after it.
Then it checks the promise of a run folder:

    once a trainer state exists, the folder loads (`attnkit.run.load_pretrained`),
    the trainer state names the last checkpoint whose write completed (or the one
    being written, if the kill came after its trainer state), with its weights,
    and the next `--resume` continues from exactly that step;
    before it exists, no checkpoint had completed, and a new start works.

The last iteration resumes with `--set train.steps=` two steps on and must
finish, leaving no temporary file of a cut write behind (a resume removes
them). The children are forked from a server that imported attnkit once
(multiprocessing's forkserver), so an iteration costs a fraction of a second;
the CI test (tests/train/test_fault_injection.py) runs a few.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import random
import signal
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from tqdm import tqdm

from attnkit import cli
from attnkit.cut_writes import is_partial
from attnkit.errors import AttnkitError
from attnkit.run import RunFolder, load_pretrained
from attnkit.train import checkpoint
from bench.harness import opening

CONFIG = """\
[model]
preset = "tiny"
n_encoder_layers = 1
n_decoder_layers = 1
max_len = 16

[data]
task = "reverse"
max_len = 6
batch_size = 8

[train]
steps = 1000000
lr = 1e-3
schedule = "constant"
warmup = 0
save_every = 1
log_every = 1
keep_last = 1
threads = 1
device = "cpu"

[eval]
every = 1000000
metric = "exact_match"
decode_examples = 4
"""
TIMEOUT = 120.0  # seconds a child may stay silent before the trial counts as hung


@dataclass
class Session:
    """What one child reported before it was killed or ended."""

    resumed: int | None = None
    """The step its `--resume` continued from."""
    writes: int = 0
    started: int | None = None
    """The step of the checkpoint write under way when it was killed."""
    completed: int | None = None
    """The step of the last checkpoint whose write completed."""
    exit: int | None = None
    """Its exit status, if it ended by itself."""

    def hear(self, kind: str, value: int) -> str:
        """Take in one message of the child (`_child`); returns its kind."""
        if kind == "start":
            self.writes, self.started = self.writes + 1, value
        elif kind == "done":
            self.completed = value
        elif kind == "resumed":
            self.resumed = value
        else:
            self.exit = value
        return kind


@dataclass
class Tally:
    iterations: int = 0
    recovered: int = 0
    inside: int = 0
    """Kills that landed inside a checkpoint write (the rest, just after one)."""
    failures: list[str] = field(default_factory=list)
    finished: bool = False
    leftovers: int = 0
    """Temporary files of interrupted writes left in the run folder at the end (harmless to
    loading and resuming, but they take room)."""

    def summary(self) -> str:
        end = "the last resume finished" if self.finished else "the last resume did NOT finish"
        return (
            f"{self.iterations} kills with SIGKILL ({self.inside} inside a checkpoint write, "
            f"{self.iterations - self.inside} just after one): {self.recovered} recovered, "
            f"{len(self.failures)} not; {end}; {self.leftovers} temporary files of cut writes "
            "left behind"
        )


def run(work: Path, iterations: int, seed: int = 0, report=None) -> Tally:
    """Kill `iterations` trainings in `work`, each at a random point of a checkpoint write,
    checking the run folder after each; `report` gets a line per iteration."""
    rng = random.Random(seed)
    config = work / "fault.toml"
    config.write_text(CONFIG)
    folder = RunFolder(work / "run")
    base = ["train", str(config), "--set", f"train.out_dir={folder.root}"]
    ctx = multiprocessing.get_context("forkserver")
    # torch._dynamo: what building the first optimizer imports, 2 s that each child would pay.
    ctx.set_forkserver_preload(["bench.fault_injection", "torch._dynamo"])
    durations: list[float] = []
    tally, verified = Tally(), None  # the step the folder was last checked to resume from
    for i in range(iterations):
        argv = base + (["--resume"] if verified is not None else [])
        kill_at = rng.randint(1, 3)
        delay = rng.random() * (statistics.median(durations) if durations else 0.02)
        session = _session(ctx, argv, work / f"child{i}.log", kill_at, delay, durations)
        tally.iterations += 1
        problem, verified = _check(folder, session, verified)
        inside = session.completed != session.started
        tally.inside += inside
        if problem is None:
            tally.recovered += 1
        else:
            tally.failures.append(f"iteration {i}: {problem}")
        if report:
            where = "inside" if inside else "just after"
            kept = "no trainer state yet" if verified is None else f"trainer state at {verified}"
            verdict = "recovered" if problem is None else f"NOT RECOVERED: {problem}"
            report(
                f"{i + 1:>3}: killed {delay * 1e3:5.1f} ms {where} the write of step "
                f"{session.started}; {kept}: {verdict}"
            )
    if verified is not None:
        final = [*base, "--set", f"train.steps={verified + 2}", "--resume"]
        session = _session(ctx, final, work / "final.log", None, 0.0, durations)
        tally.finished = (session.exit, session.resumed, session.completed) == (
            0,
            verified,
            verified + 2,
        )
    # What `attnkit.files.atomic_write` and safetensors' own save stage a file in.
    tally.leftovers = sum(is_partial(path) for path in folder.root.rglob(".*"))
    return tally


def _session(
    ctx,
    argv: list[str],
    log: Path,
    kill_at: int | None,
    delay: float,
    durations: list[float],
) -> Session:
    """Run `attnkit ARGV` in a child; kill it `delay` s into its `kill_at`-th checkpoint write."""
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(argv, sender, str(log)))
    child.start()
    sender.close()
    session, began = Session(), 0.0
    try:
        while session.exit is None:
            if not receiver.poll(TIMEOUT):
                raise TimeoutError(f"the child said nothing for {TIMEOUT:.0f} s; see {log}")
            kind = session.hear(*receiver.recv())
            if kind == "start":
                began = time.monotonic()
                if session.writes == kill_at:
                    time.sleep(delay)
                    os.kill(child.pid, signal.SIGKILL)
                    break
            elif kind == "done":
                durations.append(time.monotonic() - began)
        child.join(TIMEOUT)
        # What the child said before the kill reached it (a write that completed meanwhile).
        with contextlib.suppress(EOFError, OSError):
            while receiver.poll(0):
                session.hear(*receiver.recv())
    finally:
        if child.is_alive():
            child.kill()
        receiver.close()
    return session


def _check(
    folder: RunFolder, session: Session, verified: int | None
) -> tuple[str | None, int | None]:
    """The broken promise after a kill (None if all is well), and the step to resume from."""
    if session.exit is not None:
        return f"the training ended by itself (exit status {session.exit})", verified
    if session.resumed != verified:
        return f"--resume continued from step {session.resumed}, not {verified}", verified
    last = session.completed if session.completed is not None else verified
    if not folder.trainer_state.is_file():
        if last is not None:
            return f"the trainer state is gone, though step {last} was saved", None
        return None, None
    try:
        model = load_pretrained(folder.root)
        state = checkpoint.load_checkpoint(folder, model)
    except AttnkitError as err:
        return f"the run folder does not load: {err}", verified
    step = state["step"]
    if step not in (last, session.started):
        return (
            f"the trainer state names step {step}, but the last complete checkpoint is {last} "
            f"and the write under way was {session.started}",
            step,
        )
    return None, step


def _child(argv: list[str], conn: Connection, log: str) -> None:
    """`attnkit ARGV`, telling `conn` when each checkpoint write starts and ends, and where
    a resume continues from; its output goes to `log`."""
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    # A thread lock for the progress bar: tqdm's default, a multiprocessing one, is a named
    # semaphore that a killed child leaves behind (and Python warns of at exit).
    tqdm.set_lock(threading.RLock())
    save, resume = checkpoint.save_checkpoint, checkpoint.resume

    def reporting_save(run_dir, model, state, keep_last):
        conn.send(("start", state["step"]))
        path = save(run_dir, model, state, keep_last)
        conn.send(("done", state["step"]))
        return path

    def reporting_resume(*args):
        state = resume(*args)
        conn.send(("resumed", state["step"]))
        return state

    checkpoint.save_checkpoint, checkpoint.resume = reporting_save, reporting_resume
    conn.send(("exit", cli.main(argv)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench fault", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    opening(f"{args.iterations} iterations, seed {args.seed}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        tally = run(Path(work), args.iterations, args.seed, report=print)
    print(f"\n{tally.summary()} ({time.perf_counter() - start:.0f} s)")
    for failure in tally.failures:
        print(failure)
    if tally.failures or not tally.finished:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
