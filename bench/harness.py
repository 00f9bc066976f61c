"""Side-by-side measurement: our code and a peer's on the same work, in one process.

Each benchmark gives callables that run the same work and return a
measurement (a throughput, or seconds). They run alternately (ours, peer,
ours, peer, ...) after a warm-up, so drift in the machine's speed touches
both sides alike, and the result is the median of each side and the ratio of
the medians. Every benchmark opens with `opening()`: the line of `machine()`,
on what CPU and through which kernels the numbers were taken, and the run's
settings; `finish()` prints the table and writes it, when asked (`--out`),
where bench/results/ keeps the runs the README cites.
"""

from __future__ import annotations

import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from attnkit.kernels import few_rows
from attnkit.kernels.cpu import this_cpu

RESULTS = Path(__file__).parent / "results"


@dataclass
class Result:
    name: str
    unit: str
    ours: list[float]
    peer: list[float] | None = None
    peer_name: str = ""
    higher_is_better: bool = True
    extra: dict[str, float | str] = field(default_factory=dict)

    @property
    def ours_median(self) -> float:
        return statistics.median(self.ours)

    @property
    def peer_median(self) -> float | None:
        return statistics.median(self.peer) if self.peer else None

    @property
    def ratio(self) -> float | None:
        """How many times better we are: >1 means ahead of the peer."""
        if not self.peer:
            return None
        ours, peer = self.ours_median, self.peer_median
        return ours / peer if self.higher_is_better else peer / ours

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "ours_median": self.ours_median,
            "peer_median": self.peer_median,
            "ratio": self.ratio,
        }


def alternate(
    *sides: Callable[[], float], reps: int, warmup: int = 1, swap: bool = False
) -> list[list[float]]:
    """Each side's measurements over `reps` rounds, after `warmup` unmeasured rounds.

    A round runs the sides in the order given; with `swap`, every other round runs
    them in reverse, so that neither side always follows the other.
    """
    for _ in range(warmup):
        for side in sides:
            side()
    values: list[list[float]] = [[] for _ in sides]
    for rep in range(reps):
        order = list(enumerate(sides))
        for i, side in order[::-1] if swap and rep % 2 else order:
            values[i].append(side())
    return values


def seconds_per_call(run: Callable[[], object], calls: int = 1) -> Callable[[], float]:
    """A side that times `calls` calls of `run` and returns the seconds per call."""

    def timed() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            run()
        return (time.perf_counter() - start) / calls

    return timed


def _status_mib(field: str) -> float | None:
    """A memory field of /proc/self/status ("VmHWM:", "VmRSS:") in MiB; None off Linux."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field):
                    return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return None


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB.

    VmHWM belongs to the address space made at exec, so a child started by a big
    parent reports its own peak; getrusage's ru_maxrss would carry the parent's.
    """
    peak = _status_mib("VmHWM:")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_rss_added_mib(run: Callable[[], object]) -> float:
    """Peak resident MiB that `run()` adds above the memory already resident (Linux only)."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM to the current resident set
    baseline = _status_mib("VmRSS:")
    run()
    return peak_rss_mib() - baseline


def rss_in_subprocess(module: str, *args: str) -> float:
    """Peak resident memory of `python -m module args...`, which prints it as its last line.

    Each side runs in a fresh process so one side's allocations never count for the other.
    """
    out = subprocess.run(
        [sys.executable, "-m", module, *args], check=True, capture_output=True, text=True
    ).stdout
    return float(out.strip().splitlines()[-1])


def machine() -> str:
    """One line: the CPU, its vector flags, the path torch and attnkit take on it, and the
    GPU with its CUDA version where torch sees one."""
    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    path = [
        f"torch {torch.__version__} kernels {torch.backends.cpu.get_cpu_capability()}",
        f"BLAS {blas.group(1) if blas else 'unknown'}",
        "oneDNN" if torch.backends.mkldnn.is_available() else "no oneDNN",
        "few-row kernel" if few_rows.available() else "no few-row kernel",
    ]
    line = f"{this_cpu().describe()}, {os.cpu_count()} CPUs; path: " + ", ".join(path)
    if torch.cuda.is_available():
        line += f"; GPU {torch.cuda.get_device_name()}, CUDA {torch.version.cuda}"
    return line


def opening(*settings: str) -> str:
    """The machine's line and then the run's settings: printed first, and kept for `write`."""
    line = "; ".join([machine(), *settings])
    print(line, flush=True)
    return line


def markdown_row(r: Result) -> str:
    peer = f"{r.peer_median:,.1f}" if r.peer_median is not None else ""
    ratio = f"**{r.ratio:.2f}x**" if r.ratio is not None else ""
    notes = ", ".join(
        f"{k} {v:,.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.extra.items()
    )
    cells = [r.name, r.unit, f"{r.ours_median:,.1f}", r.peer_name, peer, ratio, notes]
    return "| " + " | ".join(cells) + " |"


def markdown_table(results: list[Result]) -> str:
    rows = [
        "| benchmark | unit | attnkit | peer | peer value | ratio | notes |",
        "| --- | --- | ---: | --- | ---: | ---: | --- |",
    ]
    return "\n".join(rows + [markdown_row(r) for r in results])


def finish(results: list[Result], header: str, out: Path | None) -> None:
    """Print the whole table; given `out`, write the results to `out`.json and the table,
    under `header`, to `out`.md."""
    print("\n" + markdown_table(results))
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {"machine": header, "results": [r.to_dict() for r in results]}
    out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    out.with_suffix(".md").write_text(f"{header}\n\n{markdown_table(results)}\n")
