"""word2vec against gensim: words a second and the vectors' quality, skip-gram and CBOW.

    python -m bench word2vec --threads 2 --reps 3
    python -m bench word2vec --corpus my_text.txt --epochs 5

The same text (by default the English side of Multi30k's training split, Tiny
Shakespeare and the 206 Wikipedia articles of the dump sample in gensim's test
data, 1.0M words; `--corpus` adds a text file), made into words the
same way (`attnkit.train.word2vec_task.split_words`, lower-cased), and the same
hyper-parameters (dimension 100, window 5, 5 negatives, sample 1e-3, min_count 5,
5 epochs, alpha 0.025 to 1e-4) go to attnkit's word2vec and to gensim's, which
run alternately (bench.harness), rep r seeding both with r. Timed: from the
sentences to the trained vectors, the vocabulary's counting included on both
sides. Words a second count every word of the text each epoch, as gensim's log
does. Quality, of each rep's vectors, by attnkit.embeddings.evaluation (equal
to gensim's own `evaluate_word_pairs` and `evaluate_word_analogies`, as the tests
check): Spearman rho on WordSim-353 and SimLex-999, Google analogy accuracy.
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import time
from pathlib import Path

import torch

from attnkit.embeddings import evaluation
from attnkit.embeddings.vectors import WordVectors
from attnkit.embeddings.word2vec import Word2Vec, Word2VecConfig, count_words
from attnkit.files import read_lines
from attnkit.kernels import sgns
from attnkit.train.vector_text import split_words
from bench.harness import Result, alternate, finish, opening

SCORES = ("wordsim353", "simlex999", "analogy")


def default_text(data_dir: Path) -> list[str]:
    with gzip.open(data_dir / "multi30k" / "train.en.gz", "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    return lines + list(read_lines(data_dir / "tinyshakespeare" / "input.txt"))


def wikipedia_lines() -> list[str]:
    """The text of the Wikipedia articles in gensim's test data, markup removed by gensim."""
    import bz2

    from gensim.corpora.wikicorpus import extract_pages, filter_wiki
    from gensim.test.utils import datapath

    name = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
    with bz2.open(datapath(name)) as f:
        return [line for _, text, _ in extract_pages(f) for line in filter_wiki(text).splitlines()]


def scores(vectors: WordVectors) -> dict[str, float]:
    pairs = {
        name: evaluation.word_similarity(vectors, evaluation.benchmark_file(name)).spearman
        for name in SCORES[:2]
    }
    return {
        **pairs,
        "analogy": evaluation.analogies(vectors, evaluation.benchmark_file("analogies")).accuracy,
    }


def compare(
    architecture: str, sentences: list[list[str]], args: argparse.Namespace
) -> list[Result]:
    """Words a second of both, alternately, and the quality of each rep's vectors."""
    from gensim.models import Word2Vec as GensimWord2Vec  # the peer: pip install gensim

    config = Word2VecConfig(architecture=architecture, epochs=args.epochs)
    words_read = sum(map(len, sentences)) * args.epochs
    quality: dict[str, list[list[float]]] = {name: [[], []] for name in SCORES}
    seeds = {"ours": 0, "gensim": 0}

    def ours() -> float:
        seeds["ours"] += 1
        start = time.perf_counter()
        words, counts = count_words(sentences, config.min_count)
        model = Word2Vec(words, counts, config, seed=seeds["ours"])
        model.fit(model.encode(sentences), threads=args.threads)
        seconds = time.perf_counter() - start
        for name, value in scores(model.word_vectors()).items():
            quality[name][0].append(value)
        return words_read / seconds

    def peer() -> float:
        seeds["gensim"] += 1
        start = time.perf_counter()
        model = GensimWord2Vec(
            sentences, vector_size=config.dim, window=config.window, negative=config.negative,
            sample=config.sample, min_count=config.min_count, epochs=config.epochs,
            alpha=config.alpha, min_alpha=config.min_alpha, sg=int(architecture == "skip-gram"),
            workers=args.threads, seed=seeds["gensim"],
        )  # fmt: skip
        seconds = time.perf_counter() - start
        wv = model.wv
        vectors = WordVectors(list(wv.index_to_key), torch.from_numpy(wv.vectors.copy()))
        for name, value in scores(vectors).items():
            quality[name][1].append(value)
        return words_read / seconds

    speed_ours, speed_peer = alternate(ours, peer, reps=args.reps, warmup=0, swap=True)
    results = [Result(f"{architecture}: training", "words/s", speed_ours, speed_peer, "gensim")]
    for name in SCORES:
        mine, theirs = ([100 * v for v in side] for side in quality[name])
        extra = {
            "gensim": " ".join(f"{v:.1f}" for v in theirs),
            "ours": " ".join(f"{v:.1f}" for v in mine),
            "mean difference": f"{statistics.mean(mine) - statistics.mean(theirs):+.1f}",
        }
        unit = "accuracy %" if name == "analogy" else "Spearman rho x 100"
        # the peer's values are in the notes: a ratio of correlations means nothing
        results.append(Result(f"{architecture}: {name}", unit, mine, extra=extra))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench word2vec", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--corpus", type=Path, help="a text file added to the default text")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    lines = default_text(args.data_dir) + wikipedia_lines()
    lines += list(read_lines(args.corpus)) if args.corpus else []
    sentences = [words for line in lines if (words := split_words(line.lower()))]
    total = sum(map(len, sentences))
    torch.set_num_threads(args.threads)
    sgns.build()  # the C loop is compiled before the clock starts
    import gensim

    header = opening(
        f"{total:,} words in {len(sentences):,} sentences, {args.epochs} epochs, "
        f"{args.threads} threads, {args.reps} reps, gensim {gensim.__version__}"
    )
    results = [r for arch in ("skip-gram", "cbow") for r in compare(arch, sentences, args)]
    finish(results, header, args.out)


if __name__ == "__main__":
    main()
