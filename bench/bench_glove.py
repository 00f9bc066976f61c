"""GloVe beside word2vec, and against a PyPI GloVe (mittens): words/s and the vectors' quality.

    python -m bench glove --threads 2 --reps 3
    python -m bench glove --reps 1 --epochs 10 --peer-words 3000

The text is the word2vec benchmark's (`bench.bench_word2vec`: Multi30k's English
training side, Tiny Shakespeare and gensim's sample of Wikipedia, 1.0M words, lower-cased,
split the same way). Two comparisons:

1. Whole vocabulary (min_count 5): attnkit's GloVe (dimension 100, a symmetric window of
   10 weighted 1/distance, alpha 0.75, eta 0.05, `--epochs` 25) at the paper's x_max 100
   and at the reference tool's demo x_max 10, beside attnkit's skip-gram and CBOW
   (gensim's settings, 5 epochs), round-robin, rep r seeding each with r. Timed: from the
   sentences to the vectors, counting included; words/s count every word of the text once per epoch,
   as the word2vec benchmark does, and the seconds to the vectors are in the notes, which
   is what a user waits for. Quality by attnkit.embeddings.evaluation, as there.
2. The same GloVe against mittens' (the GloVe of `pip install mittens`; glove-python does
   not build on this Python) on the `--peer-words` most frequent words, whose dense count
   matrix mittens needs: both get the same counts (attnkit's), the same settings and
   `--epochs` passes (mittens: full-batch AdaGrad steps, attnkit: AdaGrad epochs over the
   nonzero pairs), timed from the counts to the vectors, run alternately.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from attnkit.embeddings.glove import Glove, GloveConfig, count_cooccurrences
from attnkit.embeddings.vectors import WordVectors
from attnkit.embeddings.word2vec import Word2Vec, Word2VecConfig, count_words
from attnkit.files import read_lines
from attnkit.kernels import glove, sgns
from attnkit.kernels.glove import Cooccurrences
from attnkit.train.vector_text import split_words
from bench.bench_word2vec import SCORES, default_text, scores, wikipedia_lines
from bench.harness import Result, alternate, finish, opening


def _quality_rows(name: str, quality: dict[str, list[float]], note: str = "") -> list[Result]:
    rows = []
    for score in SCORES:
        values = [100 * v for v in quality[score]]
        extra = {"reps": " ".join(f"{v:.1f}" for v in values)}
        if note:
            extra["note"] = note
        unit = "accuracy %" if score == "analogy" else "Spearman rho x 100"
        rows.append(Result(f"{name}: {score}", unit, values, extra=extra))
    return rows


def whole_vocabulary(sentences: list[list[str]], args: argparse.Namespace) -> list[Result]:
    """GloVe at two x_max and word2vec's two architectures, each `reps` times."""
    text_words = sum(map(len, sentences))
    results: list[Result] = []
    runs = {
        "GloVe x_max 100": GloveConfig(epochs=args.epochs),
        "GloVe x_max 10": GloveConfig(epochs=args.epochs, x_max=10.0),
        "skip-gram": Word2VecConfig(architecture="skip-gram"),
        "CBOW": Word2VecConfig(architecture="cbow"),
    }
    quality = {name: {score: [] for score in SCORES} for name in runs}
    speeds: dict[str, list[float]] = {name: [] for name in runs}
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    pairs = 0
    for rep in range(1, args.reps + 1):  # round-robin, so that a change of load hits all alike
        for name, config in runs.items():
            start = time.perf_counter()
            words, counts = count_words(sentences, config.min_count)
            if isinstance(config, GloveConfig):
                cooccurrences, _ = count_cooccurrences(sentences, words, config)
                pairs = len(cooccurrences)
                model = Glove(words, counts, config, seed=rep)
                model.fit(cooccurrences, threads=args.threads)
            else:
                model = Word2Vec(words, counts, config, seed=rep)
                model.fit(model.encode(sentences), threads=args.threads)
            seconds[name].append(time.perf_counter() - start)
            speeds[name].append(text_words * config.epochs / seconds[name][-1])
            for score, value in scores(model.word_vectors()).items():
                quality[name][score].append(value)
    for name, config in runs.items():
        extra = {
            "seconds to the vectors": statistics.median(seconds[name]),
            "epochs": config.epochs,
        }
        if isinstance(config, GloveConfig):
            extra["co-occurring pairs"] = f"{pairs:,}"
        results.append(Result(f"{name}: training", "words/s", speeds[name], extra=extra))
        results += _quality_rows(name, quality[name])
    return results


def against_mittens(sentences: list[list[str]], args: argparse.Namespace) -> list[Result]:
    """attnkit's GloVe and mittens' on the same counts of the most frequent words."""
    from mittens import GloVe as MittensGloVe  # the peer: pip install mittens

    words, counts = count_words(sentences, 5)
    words, counts = words[: args.peer_words], counts[: args.peer_words]
    config = GloveConfig(epochs=args.epochs, x_max=10.0)
    pairs, _ = count_cooccurrences(sentences, words, config)
    dense = np.zeros((len(words), len(words)))
    dense[pairs.rows.numpy(), pairs.cols.numpy()] = pairs.counts.numpy()
    quality: dict[str, list[list[float]]] = {score: [[], []] for score in SCORES}
    seeds = {"ours": 0, "mittens": 0}

    def ours() -> float:
        seeds["ours"] += 1
        own = Cooccurrences(pairs.rows.clone(), pairs.cols.clone(), pairs.counts.clone())
        start = time.perf_counter()
        model = Glove(words, counts, config, seed=seeds["ours"])
        model.fit(own, threads=args.threads)
        seconds = time.perf_counter() - start
        for score, value in scores(model.word_vectors()).items():
            quality[score][0].append(value)
        return seconds

    def peer() -> float:
        seeds["mittens"] += 1
        np.random.seed(seeds["mittens"])
        model = MittensGloVe(
            n=config.dim, xmax=config.x_max, alpha=config.alpha, max_iter=config.epochs,
            learning_rate=config.eta, display_progress=0,
        )  # fmt: skip
        start = time.perf_counter()
        vectors = model.fit(dense)
        seconds = time.perf_counter() - start
        found = WordVectors(list(words), torch.from_numpy(vectors).float())
        for score, value in scores(found).items():
            quality[score][1].append(value)
        return seconds

    mine, theirs = alternate(ours, peer, reps=args.reps, warmup=0, swap=True)
    name = f"GloVe, {len(words):,} words"
    results = [
        Result(
            f"{name}: training", "seconds", mine, theirs, "mittens", higher_is_better=False,
            extra={"pairs": f"{len(pairs):,}", "epochs": config.epochs, "x_max": config.x_max},
        )
    ]  # fmt: skip
    for score in SCORES:
        ours_values, peer_values = ([100 * v for v in side] for side in quality[score])
        difference = statistics.mean(ours_values) - statistics.mean(peer_values)
        extra = {
            "mittens": " ".join(f"{v:.1f}" for v in peer_values),
            "ours": " ".join(f"{v:.1f}" for v in ours_values),
            "mean difference": f"{difference:+.1f}",
        }
        unit = "accuracy %" if score == "analogy" else "Spearman rho x 100"
        results.append(Result(f"{name}: {score}", unit, ours_values, extra=extra))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench glove", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--corpus", type=Path, help="a text file added to the default text")
    parser.add_argument("--epochs", type=int, default=25)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--peer-words", type=int, default=5000, help="mittens' vocabulary")
    parser.add_argument("--skip-peer", action="store_true", help="leave mittens out")
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    lines = default_text(args.data_dir) + wikipedia_lines()
    lines += list(read_lines(args.corpus)) if args.corpus else []
    sentences = [words for line in lines if (words := split_words(line.lower()))]
    torch.set_num_threads(args.threads)
    glove.build()  # the C loops are compiled before any clock starts
    sgns.build()
    header = opening(
        f"{sum(map(len, sentences)):,} words in {len(sentences):,} sentences, GloVe "
        f"{args.epochs} epochs, {args.threads} threads, {args.reps} reps"
    )
    results = whole_vocabulary(sentences, args)
    if not args.skip_peer:
        import mittens

        print(f"mittens {mittens.__version__} on the {args.peer_words:,} most frequent words")
        results += against_mittens(sentences, args)
    finish(results, header, args.out)


if __name__ == "__main__":
    main()
