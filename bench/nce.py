"""NCE beside negative sampling: word2vec's two objectives on the word2vec benchmark's text.

    python -m bench nce --threads 2 --reps 2 --epochs 5

The text, its words and the evaluation sets are the word2vec benchmark's
(`bench.bench_word2vec`: Multi30k's English, Tiny Shakespeare and gensim's Wikipedia sample,
1.0M words; WordSim-353, SimLex-999 and the Google analogies from gensim's test data). Both
objectives train skip-gram with the same settings (dimension 100, window 5, k = 5 noise words
from count^0.75, sample 1e-3, min_count 5, alpha 0.025 to 1e-4), rep r seeding each with r;
only `word2vec.objective` differs. Also reported: how near exp(v'_w . v_c) summed over the
vocabulary comes to 1 (its median over the 1,000 most frequent words' input vectors), the
self-normalisation NCE promises and negative sampling does not.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from attnkit.embeddings.word2vec import OBJECTIVES, Word2Vec, Word2VecConfig, count_words
from attnkit.kernels import sgns
from attnkit.train.vector_text import split_words
from bench.bench_word2vec import SCORES, default_text, scores, wikipedia_lines
from bench.harness import Result, finish, opening


def normaliser(model: Word2Vec, rows: int = 1000) -> float:
    """The median over the most frequent words c of sum_w exp(v'_w . v_c)."""
    v_in, v_out = model.vectors.inputs[:rows].double(), model.vectors.outputs.double()
    return float((v_in @ v_out.T).exp().sum(-1).median())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench nce", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    lines = default_text(args.data_dir) + wikipedia_lines()
    sentences = [words for line in lines if (words := split_words(line.lower()))]
    torch.set_num_threads(args.threads)
    sgns.build()
    header = opening(
        f"{sum(map(len, sentences)):,} words, skip-gram, {args.epochs} epochs, "
        f"{args.threads} threads, {args.reps} reps"
    )
    measured: dict[str, dict[str, list[float]]] = {
        o: {name: [] for name in (*SCORES, "normaliser", "seconds")} for o in OBJECTIVES
    }
    for rep in range(1, args.reps + 1):
        for objective in OBJECTIVES:  # alternating, so that a busy spell hits both
            config = Word2VecConfig(epochs=args.epochs, objective=objective)
            start = time.perf_counter()
            words, counts = count_words(sentences, config.min_count)
            model = Word2Vec(words, counts, config, seed=rep)
            model.fit(model.encode(sentences), threads=args.threads)
            measured[objective]["seconds"].append(time.perf_counter() - start)
            for name, value in scores(model.word_vectors()).items():
                measured[objective][name].append(100 * value)
            measured[objective]["normaliser"].append(normaliser(model))
    results = []
    for name in (*SCORES, "normaliser", "seconds"):
        ns, nce = (measured[o][name] for o in OBJECTIVES)
        unit = {"analogy": "accuracy %", "normaliser": "median sum exp", "seconds": "s"}
        extra = {
            "negative sampling": " ".join(f"{v:.2f}" for v in ns),
            "nce": " ".join(f"{v:.2f}" for v in nce),
        }
        better = name not in ("seconds",)
        results.append(
            Result(
                f"skip-gram {name}: NCE vs negative sampling",
                unit.get(name, "Spearman rho x 100"),
                nce,
                ns,
                "negative sampling",
                higher_is_better=better,
                extra={
                    **extra,
                    "mean difference": f"{statistics.mean(nce) - statistics.mean(ns):+.2f}",
                },
            )
        )
    finish(results, header, args.out)


if __name__ == "__main__":
    main()
