"""GloVe: word vectors fitted to the logarithm of co-occurrence counts (Pennington et al., 2014).

X_ij counts how often word j appears within `window` words of word i, each
occurrence weighted 1/distance (`distance_weighting`), in both directions
(`symmetric`). The model gives each word a vector w_i and a context vector c_j,
and biases b_i, b~_j, and fits them by weighted least squares over the nonzero
counts only:

    J = sum_{X_ij > 0} f(X_ij) (w_i . c_j + b_i + b~_j - log X_ij)^2,
    f(x) = min(1, (x / x_max)^alpha)                        (x_max 100, alpha 3/4)

so rare pairs weigh little and frequent ones no more than 1. AdaGrad (rate
`eta`) visits the pairs in one random order every epoch, as the reference C tool
does (`attnkit/kernels/glove.c` says how, to the detail of its step), and the
vectors kept are w + c: the two sides learn the same thing from a symmetric X,
and their sum is a little better than either (the paper, section 4.2).

Counting reads the text once, a chunk of sentences at a time, into a hash
table of the distinct pairs, so memory goes with those pairs, not with the
corpus: 16 bytes a table slot (at most 70% full, so 23 to 46 bytes a pair
while counting), then 12 bytes a pair (row, column, count) for training, and
the parameters (16 d + 16 bytes a word). `Cooccurrences.bytes` and
`CountTable.bytes` give the figures of a run; docs/results/word-vectors.md
gives them for a million words and for a hundred million.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.checks import check, finite_fields, positive
from attnkit.embeddings.vectors import WordVectors
from attnkit.embeddings.word2vec import encode
from attnkit.kernels import glove as kernel
from attnkit.kernels.glove import Cooccurrences, CountTable, Parameters


@dataclass(frozen=True)
class GloveConfig:
    """The hyper-parameters, named as the paper and the reference tool name them; the [glove]
    section of a run config.

    dim: the vectors' dimension (each word has a word vector and a context vector, summed).
    window: the most words on each side counted as co-occurring.
    min_count: words seen fewer times are left out of the vocabulary.
    symmetric: count context on both sides of a word (False: the left side only).
    distance_weighting: a pair `d` words apart adds 1/d to X_ij (False: adds 1).
    x_max: counts at or above it get full weight in the loss, f(x) = min(1, (x/x_max)^alpha).
    alpha: the exponent of that weighting (the paper's 3/4).
    eta: AdaGrad's initial learning rate.
    epochs: passes over the non-zero entries of X.
    """

    dim: int = 100
    window: int = 10
    min_count: int = 5
    symmetric: bool = True
    distance_weighting: bool = True
    x_max: float = 100.0
    alpha: float = 0.75
    eta: float = 0.05
    epochs: int = 25

    def __post_init__(self) -> None:
        finite_fields(self, "glove")
        for name in ("dim", "window", "min_count", "epochs", "x_max", "alpha", "eta"):
            positive(f"glove.{name}", getattr(self, name))
        check(self.alpha <= 1, f"glove.alpha is an exponent of at most 1, got {self.alpha}")


CHUNK_WORDS = 1_000_000  # words encoded and counted at a time


def count_cooccurrences(
    sentences: Iterable[Sequence[str]],
    words: Sequence[str],
    config: GloveConfig,
    chunk_words: int = CHUNK_WORDS,
) -> tuple[Cooccurrences, int]:
    """X of `sentences` (read once, `chunk_words` at a time) over `words` (others left
    out, as word2vec leaves them out); returns X and the most memory the table took."""
    index = {w: i for i, w in enumerate(words)}
    table = CountTable(len(words), config.window, config.symmetric, config.distance_weighting)
    chunk: list[Sequence[str]] = []
    size = 0
    for sentence in sentences:
        chunk.append(sentence)
        size += len(sentence)
        if size >= chunk_words:
            corpus = encode(chunk, index)
            table.add(corpus.ids, corpus.starts)
            chunk, size = [], 0
    corpus = encode(chunk, index)
    table.add(corpus.ids, corpus.starts)
    return table.pairs(), table.bytes


def weighting(x: Tensor, x_max: float, alpha: float) -> Tensor:
    """f(x) = min(1, (x / x_max)^alpha)."""
    return (x / x_max).pow(alpha).clamp(max=1.0)


class Glove:
    """The vectors, biases and AdaGrad state of one vocabulary, and the passes that move them."""

    def __init__(self, words: list[str], counts: Tensor, config: GloveConfig, seed: int = 1):
        self.words, self.counts, self.config, self.seed = words, counts, config, seed
        generator = torch.Generator().manual_seed(seed)
        vocab, dim = len(words), config.dim

        def uniform(*shape: int) -> Tensor:  # the reference's start: U(-0.5, 0.5) / d
            return (torch.rand(*shape, generator=generator) - 0.5) / dim

        self.params = Parameters(
            uniform(vocab, dim), uniform(vocab, dim), uniform(vocab), uniform(vocab),
            torch.ones(vocab, dim), torch.ones(vocab, dim), torch.ones(vocab), torch.ones(vocab),
        )  # fmt: skip

    def word_vectors(self) -> WordVectors:
        """w + c, by word."""
        return WordVectors(list(self.words), self.params.w + self.params.c)

    def shuffle(self, pairs: Cooccurrences) -> None:
        """Put `pairs` in the random order every epoch visits them in, drawn from the seed:
        once, as the reference tool shuffles its file once (the counts come out of the table
        in the same order every time, so a resumed run takes the same path)."""
        pairs.shuffle(self.seed)

    def epoch(self, pairs: Cooccurrences, threads: int = 1) -> float:
        """One pass over `pairs` in their order, `threads` threads each a contiguous share;
        returns the mean of 0.5 f(X) diff^2 over the pairs."""
        c = self.config
        cost = kernel.train(self.params, pairs, c.eta, c.x_max, c.alpha, threads)
        return cost / max(len(pairs), 1)

    def fit(
        self,
        pairs: Cooccurrences,
        threads: int = 1,
        on_epoch: Callable[[int, float], None] | None = None,
    ) -> None:
        """Shuffle `pairs`, then every epoch; `on_epoch(epoch, mean cost)` hears after each."""
        self.shuffle(pairs)
        for epoch in range(self.config.epochs):
            cost = self.epoch(pairs, threads)
            if on_epoch is not None:
                on_epoch(epoch, cost)

    def loss(self, pairs: Cooccurrences) -> float:
        """sum 0.5 f(X_ij) (w_i . c_j + b_i + b~_j - log X_ij)^2 over `pairs`, as it stands."""
        p, c = self.params, self.config
        rows, cols, x = pairs.rows.long(), pairs.cols.long(), pairs.counts.double()
        diff = (p.w[rows].double() * p.c[cols].double()).sum(1) + p.bw[rows] + p.bc[cols]
        diff = diff - x.log()
        return float((0.5 * weighting(x, c.x_max, c.alpha) * diff**2).sum())
