"""Side-by-side measurement: our code and a peer's on the same work, in one process.

Each benchmark gives two callables that run the same work and return a
throughput. They run alternately (ours, peer, ours, peer, ...) after a
warm-up, so drift in the machine's speed touches both sides alike, and the
result is the median of each side and the ratio of the medians.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field


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
    ours: Callable[[], float],
    peer: Callable[[], float] | None,
    *,
    reps: int,
    warmup: int = 1,
) -> tuple[list[float], list[float] | None]:
    """Run each side `warmup` times unmeasured, then `reps` times each, interleaved."""
    for _ in range(warmup):
        ours()
        if peer is not None:
            peer()
    mine, theirs = [], []
    for _ in range(reps):
        mine.append(ours())
        if peer is not None:
            theirs.append(peer())
    return mine, (theirs if peer is not None else None)


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


def markdown_table(results: list[Result]) -> str:
    rows = [
        "| benchmark | unit | attnkit | peer | peer value | ratio | notes |",
        "| --- | --- | ---: | --- | ---: | ---: | --- |",
    ]
    for r in results:
        peer = f"{r.peer_median:,.1f}" if r.peer_median is not None else ""
        ratio = f"**{r.ratio:.2f}x**" if r.ratio is not None else ""
        notes = ", ".join(
            f"{k} {v:,.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.extra.items()
        )
        cells = [r.name, r.unit, f"{r.ours_median:,.1f}", r.peer_name, peer, ratio, notes]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def write(results: list[Result], json_path: str, md_path: str, header: str) -> None:
    with open(json_path, "w") as f:
        json.dump({"machine": header, "results": [r.to_dict() for r in results]}, f, indent=2)
    with open(md_path, "w") as f:
        f.write(f"{header}\n\n{markdown_table(results)}\n")
