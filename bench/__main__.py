"""`python -m bench`: the machine's matmul peaks and the training benchmarks, side by side.

Prints a table and writes bench/results_train.json and bench/results_train.md.
Decoding has its own script (bench/bench_generate.py), data its own
(bench/bench_data.py). Both sides of every benchmark run in this one
process, with the same threads and allocator: glibc's default, or with
`--reuse-freed-memory` the setting `attnkit train` makes on a CPU
(`attnkit/train/host_memory.py`), which then applies to both sides.
"""

from __future__ import annotations

import argparse
import platform

import torch

from attnkit.train.host_memory import reuse_freed_memory
from bench.harness import markdown_table, write
from bench.peak import matmul_peaks
from bench.training import WORKS, run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(WORKS), help=f"of {', '.join(WORKS)}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3, help="alternating repetitions per side")
    parser.add_argument("--steps", type=int, default=2, help="training steps per repetition")
    parser.add_argument("--bf16", action="store_true", help="also run each benchmark in bf16")
    parser.add_argument(
        "--compile", action="store_true", help="also run each with torch.compile on both sides"
    )
    parser.add_argument(
        "--reuse-freed-memory",
        action="store_true",
        help="keep freed memory in the process, as `attnkit train` does (both sides)",
    )
    parser.add_argument(
        "--no-memory", dest="memory", action="store_false", help="skip the peak-RSS subprocesses"
    )
    parser.add_argument("--out", default="bench/results_train")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    if args.reuse_freed_memory and not reuse_freed_memory():
        parser.error("--reuse-freed-memory needs glibc (Linux)")
    allocator = "freed memory kept" if args.reuse_freed_memory else "glibc default"
    peaks = matmul_peaks()
    header = (
        f"{platform.processor() or platform.machine()}, {args.threads} threads, "
        f"torch {torch.__version__}, allocator {allocator}; matmul peaks: "
        + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peaks.items())
    )
    print(header)
    modes = ["fp32", *(["bf16"] if args.bf16 else []), *(["compile"] if args.compile else [])]
    results = []
    for name in args.names:
        for mode in modes:
            results.append(run(name, mode, peaks, args.reps, args.steps, args.memory))
            print(markdown_table(results[-1:]).splitlines()[-1], flush=True)
    print("\n" + markdown_table(results))
    write(results, f"{args.out}.json", f"{args.out}.md", header)


if __name__ == "__main__":
    main()
