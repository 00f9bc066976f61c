"""word2vec: word vectors learned from the words around them (Mikolov et al., 2013).

Each word w has an input vector v_w (the one kept) and an output vector v'_w.
Skip-gram makes one prediction for each pair of w and a word c of its context
(h = v_c predicts w, as the C tool pairs them); CBOW one for each w, from h, the
mean of its context's input vectors. Negative sampling replaces the
softmax over the vocabulary by k binary decisions, the true word against k
words drawn from the noise distribution P_n:

    loss = -log sigma(v'_w . h) - sum_{i=1..k} log sigma(-v'_{n_i} . h),
    n_i ~ P_n(w) = count(w)^0.75 / sum_v count(v)^0.75

Noise-contrastive estimation (`objective = "nce"`; Gutmann and Hyvarinen 2010, as Mnih
and Teh 2012 train language models with it), the estimator negative sampling simplifies,
is logistic regression of data against noise: a word t is told apart from k draws of
P_n by its score minus the log of the noise's odds,

    s(t) = v'_t . h - log(k P_n(t)),
    loss = -log sigma(s(w)) - sum_{i=1..k} log sigma(-s(n_i)),

which makes exp(v'_w . h) estimate the (self-normalised) p(w | h) itself, where negative
sampling (the offset left out) learns only what separates words from noise. Every draw
counts, one equal to w too. The loop is the same C loop with the offset added (`sgns.c`).

SGD on either with rate alpha, g = alpha (label - sigma(s)), s = v'.h for negative sampling:

    v'_t += g h,    h's input vectors += sum_t g v'_t    (CBOW: each context word's, the whole sum)

As in the C tool and gensim: words under `min_count` are dropped before
anything; a word of count c is kept with probability
min(1, (sqrt(c / (t N)) + 1) t N / c) each epoch (subsampling, N the words kept,
t = `sample`); the window around each word is b = 1..`window` words, b uniform
(nearer words count more on average); negatives equal to the true word are not
used; alpha falls linearly from `alpha` to `min_alpha` over all epochs' words.

The updates run one at a time in C (`sgns.c`), threads sharing the vectors
without locks as in the C tool and gensim. Updates batched on tensors (every
pair of 2,048 centre words computed from the same vectors, the steps summed)
were tried first: on Multi30k's English and Tiny Shakespeare they diverged
(summed steps of a frequent word overshoot, where each sequential step would
see the last) and, their steps averaged per word instead, learned nothing
useful (SimLex-999 rho -0.16 against gensim's 0.19), at 1/8 of gensim's speed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from attnkit.checks import check, choice, finite_fields, non_negative, positive
from attnkit.embeddings.vectors import WordVectors
from attnkit.errors import AttnkitError
from attnkit.kernels import sgns

ARCHITECTURES = ("skip-gram", "cbow")
OBJECTIVES = ("negative-sampling", "nce")


@dataclass(frozen=True)
class Word2VecConfig:
    """The hyper-parameters, named and defaulted as gensim's (`sg` is `architecture`); the
    [word2vec] section of a run config.

    architecture: `skip-gram` (predict each context word from the word) or `cbow` (the word
        from the mean of its context's vectors).
    dim: the vectors' dimension.
    window: the most words on each side that count as context (1..window drawn per word).
    negative: noise words drawn per prediction (negative sampling's and NCE's k).
    objective: `negative-sampling` (word2vec's) or `nce` (noise-contrastive estimation:
        the scores shifted by log k P_n(w), Mnih and Teh's form).
    ns_exponent: the noise distribution is count^ns_exponent (word2vec's 0.75).
    sample: the threshold of subsampling frequent words (0 keeps every word).
    min_count: words seen fewer times are left out of the vocabulary.
    epochs: passes over the text.
    alpha, min_alpha: the learning rate, falling linearly from alpha to min_alpha.
    """

    architecture: str = "skip-gram"
    dim: int = 100
    window: int = 5
    negative: int = 5
    objective: str = "negative-sampling"
    ns_exponent: float = 0.75
    sample: float = 1e-3
    min_count: int = 5
    epochs: int = 5
    alpha: float = 0.025
    min_alpha: float = 1e-4

    def __post_init__(self) -> None:
        finite_fields(self, "word2vec")
        choice("word2vec.architecture", self.architecture, ARCHITECTURES)
        choice("word2vec.objective", self.objective, OBJECTIVES)
        for name in ("dim", "window", "negative", "min_count", "epochs", "alpha"):
            positive(f"word2vec.{name}", getattr(self, name))
        non_negative("word2vec.sample", self.sample)
        non_negative("word2vec.min_alpha", self.min_alpha)
        check(
            self.min_alpha <= self.alpha,
            f"word2vec.min_alpha {self.min_alpha} must not exceed word2vec.alpha {self.alpha}",
        )


def count_words(sentences: Iterable[Sequence[str]], min_count: int) -> tuple[list[str], Tensor]:
    """The words seen `min_count` times or more, most frequent first (ties: first seen first)."""
    counts = Counter(word for sentence in sentences for word in sentence)
    kept = [(word, n) for word, n in counts.items() if n >= min_count]
    kept.sort(key=lambda item: -item[1])  # stable: equal counts keep their first-seen order
    if not counts:  # lowering min_count below 1 would not help: there is nothing to count
        raise AttnkitError("the corpus holds no words; give a text that is not empty")
    if not kept:
        raise AttnkitError(f"no word occurs {min_count} times or more; lower word2vec.min_count.")
    return [w for w, _ in kept], torch.tensor([n for _, n in kept], dtype=torch.float64)


def noise_distribution(counts: Tensor, exponent: float = 0.75) -> Tensor:
    """P_n(w) = count(w)^e / sum_v count(v)^e."""
    weights = counts.double() ** exponent
    return weights / weights.sum()


def keep_probabilities(counts: Tensor, sample: float) -> Tensor:
    """The chance that subsampling keeps a word: min(1, (sqrt(c / tN) + 1) tN / c); 1 if t = 0."""
    counts = counts.double()
    if sample == 0:
        return torch.ones_like(counts)
    threshold = sample * counts.sum()
    return ((counts / threshold).sqrt() + 1).mul(threshold / counts).clamp(max=1.0)


class AliasTable:
    """Draws from a discrete distribution in O(1) a draw (Walker's alias method, Vose's build).

    Each of the n slots holds its own word with probability `own[i]` and else
    `alias[i]`, so a draw (in `sgns.c`) is one uniform slot and one coin: exact,
    unlike the C tool's table of 10^8 rounded entries, and faster than a binary
    search of the CDF.
    """

    def __init__(self, probs: Tensor) -> None:
        n = len(probs)
        scaled = (probs.double() * n).tolist()
        own, alias = [1.0] * n, list(range(n))
        small = [i for i, p in enumerate(scaled) if p < 1.0]
        large = [i for i, p in enumerate(scaled) if p >= 1.0]
        while small and large:
            s, g = small.pop(), large.pop()
            own[s], alias[s] = scaled[s], g
            scaled[g] -= 1.0 - scaled[s]  # g gives slot s what s lacks
            (small if scaled[g] < 1.0 else large).append(g)
        self.own = torch.tensor(own, dtype=torch.float64)  # slots left over hold themselves wholly
        self.alias = torch.tensor(alias, dtype=torch.long)

    def probabilities(self) -> Tensor:
        """The distribution the table draws from: each slot's 1/n split between its two words."""
        n = len(self.own)
        probs = torch.zeros(n, dtype=torch.float64).index_add_(0, torch.arange(n), self.own)
        return probs.index_add_(0, self.alias, 1.0 - self.own) / n


MAX_SENTENCE = 10_000  # longer lines are cut into sentences of this many words, as gensim does


@dataclass(frozen=True)
class Corpus:
    """Sentences as one row of word ids: sentence s is ids[starts[s]:starts[s + 1]]."""

    ids: Tensor
    starts: Tensor

    @property
    def words(self) -> int:
        return len(self.ids)

    def slice(self, first: int, last: int) -> Corpus:
        """Sentences first..last - 1, their starts counted from 0."""
        starts = self.starts[first : last + 1]
        return Corpus(self.ids[int(starts[0]) : int(starts[-1])], starts - starts[0])


def encode(sentences: Iterable[Sequence[str]], index: dict[str, int]) -> Corpus:
    """Sentences as the ids `index` gives their words, unknown words left out, each cut at
    MAX_SENTENCE words."""
    ids: list[int] = []
    starts = [0]
    for sentence in sentences:
        known = [index[w] for w in sentence if w in index]
        for at in range(0, len(known), MAX_SENTENCE):
            ids.extend(known[at : at + MAX_SENTENCE])
            starts.append(len(ids))
    return Corpus(torch.tensor(ids, dtype=torch.long), torch.tensor(starts, dtype=torch.long))


def nce_offsets(noise: Tensor, negative: int) -> Tensor:
    """NCE's log(k P_n(w)) per word: the log odds of w being drawn among k noise words."""
    return (noise.double() * negative).log().float()


class Word2Vec:
    """Input and output vectors, and the skip-gram or CBOW SGD (negative sampling or NCE) that
    moves them."""

    def __init__(
        self, words: list[str], counts: Tensor, config: Word2VecConfig, seed: int = 1
    ) -> None:
        self.words, self.counts, self.config, self.seed = words, counts, config, seed
        generator = torch.Generator().manual_seed(seed)
        vocab, dim = len(words), config.dim
        # gensim's start: inputs uniform in [-1/d, 1/d), outputs zero
        inputs = (torch.rand(vocab, dim, generator=generator) * 2 - 1) / dim
        self.vectors = sgns.Vectors(inputs, torch.zeros(vocab, dim))
        probs = noise_distribution(counts, config.ns_exponent)
        noise = AliasTable(probs)
        nce = config.objective == "nce"
        self.sampling = sgns.Sampling(
            keep_probabilities(counts, config.sample),
            noise.own,
            noise.alias,
            config.window,
            config.negative,
            config.architecture == "cbow",
            nce_offsets(probs, config.negative) if nce else None,
        )

    def word_vectors(self) -> WordVectors:
        """The input vectors, the ones word2vec keeps, by word."""
        return WordVectors(list(self.words), self.vectors.inputs.clone())

    def encode(self, sentences: Iterable[Sequence[str]]) -> Corpus:
        """Sentences as word ids, unknown words left out, each cut at MAX_SENTENCE words."""
        return encode(sentences, {w: i for i, w in enumerate(self.words)})

    def train_pass(
        self, corpus: Corpus, alphas: tuple[float, float], seed: int, threads: int = 1
    ) -> tuple[float, int]:
        """One pass of SGD over `corpus`, the rate going linearly from alphas[0] to alphas[1];
        returns the summed loss and the number of updates."""
        return sgns.train(
            self.vectors, corpus.ids, corpus.starts, self.sampling, alphas, seed, threads
        )

    def fit(
        self,
        corpus: Corpus,
        threads: int = 1,
        chunk_words: int = 100_000,
        on_chunk: Callable[[Progress], None] | None = None,
    ) -> None:
        """All epochs over `corpus` in chunks of about `chunk_words` words, the rate decaying
        linearly from alpha to min_alpha over all of them; `on_chunk` hears after each."""
        for progress in self.chunks(corpus, chunk_words):
            loss, updates = self.train_pass(
                progress.corpus, progress.alphas, progress.seed, threads
            )
            if on_chunk is not None:
                on_chunk(replace(progress, loss=loss / max(updates, 1), updates=updates))

    def chunks(self, corpus: Corpus, chunk_words: int) -> Iterator[Progress]:
        """The chunks of every epoch in turn, each with its rates and its own seed."""
        config, total = self.config, corpus.words * self.config.epochs
        bounds = _chunk_bounds(corpus.starts, chunk_words)
        done = 0
        for epoch in range(config.epochs):
            for chunk, (first, last) in enumerate(bounds):
                part = corpus.slice(first, last)
                alphas = tuple(
                    config.alpha - (config.alpha - config.min_alpha) * w / max(total, 1)
                    for w in (done, done + part.words)
                )
                done += part.words
                yield Progress(
                    epoch,
                    part,
                    alphas,
                    self.seed * 1_000_003 + len(bounds) * epoch + chunk,
                    done,
                    total,
                )


@dataclass(frozen=True)
class Progress:
    """A chunk of training: its epoch, sentences, rates and seed; words done of all; its loss."""

    epoch: int
    corpus: Corpus
    alphas: tuple[float, float]
    seed: int
    words_done: int
    words_total: int
    loss: float = float("nan")  # the mean loss of the chunk's updates, once trained
    updates: int = 0


def _chunk_bounds(starts: Tensor, chunk_words: int) -> list[tuple[int, int]]:
    """Runs of whole sentences of about chunk_words words each."""
    bounds, first = [], 0
    n = len(starts) - 1
    while first < n:
        last = int(torch.searchsorted(starts, starts[first] + chunk_words, right=True))
        last = min(max(last - 1, first + 1), n)
        bounds.append((first, last))
        first = last
    return bounds
