"""Memory of a language-model run reading a large corpus: the corpus in one line (text8's
shape) against the same text in lines of 60 characters.

What is measured is what a run holds before its first step: the tokenizer trained on the
corpus and the train and val streams of ids, built by `attnkit.train.build_task` (the path
`attnkit train` takes) for a one-block model. Each shape runs in a fresh process, and its
peak resident memory (VmHWM) is the measure. Memory grows with the corpus (the ids are
int32, 4 bytes a token, plus the tokenizer's work on one chunk at a time), never with the
length of its lines: `read_lines(..., pieces=True)` reads a long line in pieces and
`LanguageModelDataset.from_lines` encodes at most about half a million characters a call.

    python -m bench corpus-memory --mb 100          # the figure docs/results/corpus-memory.md gives
    python -m bench corpus-memory --mb 6 --tokenizer byte-bpe

The bound it checks (exit status 1 when broken): the one-line corpus's peak is at most
`--bound` (1.25) times the lined corpus's.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from bench.harness import Result, finish, opening, peak_rss_mib

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def write_corpus(folder: Path, mb: float) -> tuple[Path, Path]:
    """`mb` megabytes of words (a fixed random vocabulary of 20,000 words, seeded) in one line,
    and the same text wrapped at 60 characters."""
    rng = random.Random(0)
    vocabulary = ["".join(rng.choices(LETTERS, k=rng.randint(1, 10))) for _ in range(20_000)]
    size = int(mb * 1_000_000)
    one_line, lined = folder / "one_line.txt", folder / "lines.txt"
    with open(one_line, "w") as out:
        written = 0
        while written < size:
            words = " ".join(rng.choices(vocabulary, k=10_000)) + " "
            out.write(words)
            written += len(words)
    with open(one_line) as text, open(lined, "w") as out:
        while block := text.read(1 << 20):
            rest = text.readline().split(" ", 1)  # finish the word the block cut
            block += rest[0]
            out.write("\n".join(textwrap.wrap(block, 60, break_long_words=False)) + "\n")
            if len(rest) > 1:
                text.seek(text.tell() - len(rest[1].encode()))
    return one_line, lined


def worker(corpus: str, tokenizer: str, out_dir: str) -> None:
    """Build the run's task from `corpus`; print seconds, tokens and peak MiB (the last line)."""
    from attnkit.train import RunConfig
    from attnkit.train.tasks import build_task

    config = RunConfig.from_dict(
        {
            "model": {"preset": "gpt-tiny", "n_decoder_layers": 1, "max_len": 128},
            "data": {
                "task": "language-model",
                "corpus": corpus,
                "tokenizer": tokenizer,
                "vocab_size": 2000,
                "block_size": 128,
            },
            "train": {"out_dir": out_dir, "steps": 1, "threads": 1},
        }
    )
    start = time.perf_counter()
    setup = build_task(config)
    tokens = sum(len(data.dataset.stream) for data in (setup.train_data, setup.val_data))
    print(time.perf_counter() - start, tokens, peak_rss_mib())


def measure(corpus: Path, tokenizer: str, out_dir: str) -> tuple[float, int, float]:
    """Seconds, tokens and peak MiB of `worker` in a fresh process."""
    command = [sys.executable, "-m", "bench.bench_corpus_memory", "--worker"]
    out = subprocess.run(
        [*command, str(corpus), tokenizer, out_dir], check=True, capture_output=True, text=True
    ).stdout
    seconds, tokens, peak = out.split()[-3:]
    return float(seconds), int(tokens), float(peak)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench corpus-memory", description=__doc__)
    parser.add_argument("--mb", type=float, default=100.0, help="corpus size (default 100)")
    parser.add_argument("--tokenizer", default="char", help="the run's data.tokenizer")
    parser.add_argument("--bound", type=float, default=1.25)
    parser.add_argument("--out", type=Path, help="write the table here (.md and .json)")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    header = opening(f"{args.mb:g} MB corpus, {args.tokenizer} tokenizer, bound {args.bound}x")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        one_line, lined = write_corpus(Path(tmp), args.mb)
        peaks = {}
        for name, path in (("in lines of 60 characters", lined), ("in one line", one_line)):
            seconds, tokens, peaks[name] = measure(
                path, args.tokenizer, str(Path(tmp) / f"run-{path.stem}")
            )
            extra = {"MiB per corpus MB": peaks[name] / args.mb, "tokens": f"{tokens:,}"}
            extra["seconds"] = seconds
            results.append(
                Result(
                    f"peak RSS, {args.mb:g} MB corpus {name}",
                    "MiB",
                    [peaks[name]],
                    higher_is_better=False,
                    extra=extra,
                )
            )
    ratio = peaks["in one line"] / peaks["in lines of 60 characters"]
    results[-1].extra["one line / lines"] = ratio
    finish(results, header, args.out)
    held = ratio <= args.bound
    print(f"\none line / lines = {ratio:.2f} ({'within' if held else 'over'} {args.bound}x)")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
