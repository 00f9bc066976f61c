"""Benchmark of the data path on Multi30k: tokenizer training, encoding, batch padding.

Reports, in one run:
- the time to train a joint BPE vocabulary (10k by default) on train.de + train.en;
- the time to encode all 29,000 training pairs, both as bare `encode_batch`
  calls and as a whole `ParallelDataset` (read, encode, filter, pack);
- the padding efficiency (real tokens / all tokens in the batch tensors) of
  one epoch of token-budget batches at 4,096 tokens, against shuffled
  fixed-size batches of 32 and 64 pairs and of the budget batches' mean size.

    python -m bench data --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import os
import platform
from collections.abc import Callable
from typing import TypeVar

import tokenizers
import torch
from torch.utils.data import DataLoader

from attnkit.data import (
    ParallelDataset,
    TokenBudgetSampler,
    corpus_files,
    padding_efficiency,
    read_lines,
)
from attnkit.tokenizer import Tokenizer
from bench.harness import alternate, opening, seconds_per_call

T = TypeVar("T")


def timed(fn: Callable[[], T], repeats: int = 1) -> tuple[T, float]:
    """The result of `fn` and its best seconds over `repeats` runs, the first one counted."""
    made: list[T] = []

    def run() -> None:
        made[:] = [fn()]  # the last result is kept, each only until the next is made

    seconds = alternate(seconds_per_call(run), reps=repeats, warmup=0)[0]
    return made[0], min(seconds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench data", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--data-dir", default=None, help="folder holding multi30k/")
    parser.add_argument("--vocab-size", type=int, default=10000)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3, help="encoding runs; the best is kept")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--batch-sizes", default="32,64", help="fixed batch sizes to compare, besides the mean"
    )
    args = parser.parse_args(argv)
    opening(f"tokenizers {tokenizers.__version__}")

    src_path, tgt_path = corpus_files(
        "multi30k", "train", langs=("de", "en"), data_dir=args.data_dir
    )
    tokenizer, train_s = timed(
        lambda: Tokenizer.train("bpe", files=[src_path, tgt_path], vocab_size=args.vocab_size)
    )
    src_lines, tgt_lines = list(read_lines(src_path)), list(read_lines(tgt_path))
    _, encode_s = timed(
        lambda: (
            tokenizer.encode_batch(src_lines, add_eos=True),
            tokenizer.encode_batch(tgt_lines, add_bos=True, add_eos=True),
        ),
        args.repeats,
    )
    data, dataset_s = timed(
        lambda: ParallelDataset.from_files(src_path, tgt_path, tokenizer=tokenizer), args.repeats
    )

    sampler = TokenBudgetSampler(data.lengths, args.max_tokens, seed=args.seed)
    budget = list(DataLoader(data, batch_sampler=sampler, collate_fn=data.collate))
    mean_size = round(len(data) / len(budget))
    fixed = {}
    for size in [*map(int, args.batch_sizes.split(",")), mean_size]:
        generator = torch.Generator().manual_seed(args.seed)
        loader = DataLoader(
            data, batch_size=size, shuffle=True, collate_fn=data.collate, generator=generator
        )
        fixed[size] = padding_efficiency(loader)
    most_tokens = max(max(b.src.numel(), b.tgt.numel()) for b in budget)

    print(f"attnkit data benchmark: Multi30k train, {len(data):,} pairs (de -> en)")
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"tokenizers {tokenizers.__version__}, {os.cpu_count()} CPUs"
    )
    print(f"train joint BPE ({tokenizer.vocab_size:,} tokens)   {train_s:8.2f} s")
    print(f"encode {len(data):,} pairs (encode_batch)      {encode_s:8.2f} s")
    print(f"build ParallelDataset (read+encode+pack) {dataset_s:8.2f} s")
    print(
        f"token-budget batches at {args.max_tokens:,} tokens: {len(budget)} batches, "
        f"mean {mean_size} pairs, largest side tensor {most_tokens:,} ids, "
        f"padding efficiency {padding_efficiency(budget):.3f}"
    )
    for size, efficiency in fixed.items():
        print(
            f"shuffled fixed-size batches of {size:3d} pairs: padding efficiency {efficiency:.3f}"
        )


if __name__ == "__main__":
    main()
