"""GloVe's counting over a stream of sentences, its loss as the paper writes it, and a fit."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch

from attnkit.embeddings.glove import Glove, GloveConfig, count_cooccurrences, weighting
from attnkit.embeddings.word2vec import count_words
from attnkit.errors import AttnkitError

TEXT = [
    ["the", "cat", "sat", "on", "the", "mat"],
    ["the", "dog", "sat", "on", "the", "log"],
    [],
] * 40 + [["a", "rare", "word"]]


def _python_counts(sentences, words, window):
    """X_ij by the paper: 1/k for each pair k apart within `window`, both ways, over the words
    kept (the others dropped first, as word2vec drops them)."""
    kept = set(words)
    x = defaultdict(float)
    for sentence in sentences:
        s = [w for w in sentence if w in kept]
        for t in range(len(s)):
            for k in range(1, window + 1):
                if t + k < len(s):
                    x[s[t], s[t + k]] += 1 / k
                    x[s[t + k], s[t]] += 1 / k
    return x


@pytest.mark.parametrize("chunk_words", [3, 50, 10_000])
def test_counts_stream_in_chunks_over_the_kept_words(chunk_words) -> None:
    words, _ = count_words(TEXT, min_count=2)  # "a rare word" occurs once: left out
    assert "rare" not in words and "cat" in words
    config = GloveConfig(window=3, min_count=2)
    pairs, table_bytes = count_cooccurrences(iter(TEXT), words, config, chunk_words=chunk_words)
    rows, cols = pairs.rows.tolist(), pairs.cols.tolist()
    got = {
        (words[r], words[c]): x for r, c, x in zip(rows, cols, pairs.counts.tolist(), strict=True)
    }
    expected = _python_counts(TEXT, words, 3)
    assert got.keys() == expected.keys()
    assert all(math.isclose(got[k], v, rel_tol=1e-6) for k, v in expected.items())
    assert table_bytes >= 16 * len(pairs) and pairs.bytes == 12 * len(pairs)


def test_the_loss_is_the_papers_weighted_least_squares() -> None:
    words, counts = count_words(TEXT, 1)
    config = GloveConfig(dim=4, window=2, min_count=1, x_max=5.0)
    pairs, _ = count_cooccurrences(TEXT, words, config)
    model = Glove(words, counts, config, seed=0)
    p = model.params
    expected = 0.0
    for i, j, x in zip(
        pairs.rows.tolist(), pairs.cols.tolist(), pairs.counts.tolist(), strict=True
    ):
        f = 1.0 if x >= 5.0 else (x / 5.0) ** 0.75
        diff = float(p.w[i] @ p.c[j] + p.bw[i] + p.bc[j]) - math.log(x)
        expected += 0.5 * f * diff**2
    assert math.isclose(model.loss(pairs), expected, rel_tol=1e-5)
    assert weighting(torch.tensor([0.5, 5.0, 50.0]), 5.0, 0.75).tolist() == pytest.approx(
        [0.1**0.75, 1.0, 1.0]
    )


def test_a_fit_lowers_the_loss_and_keeps_w_plus_c() -> None:
    words, counts = count_words(TEXT, 1)
    config = GloveConfig(dim=8, window=2, min_count=1, x_max=5.0, epochs=20)
    pairs, _ = count_cooccurrences(TEXT, words, config)
    model = Glove(words, counts, config, seed=0)
    start = model.loss(pairs)
    costs: list[float] = []
    model.fit(pairs, on_epoch=lambda epoch, cost: costs.append(cost))
    assert len(costs) == 20 and model.loss(pairs) < 0.05 * start
    vectors = model.word_vectors()
    assert torch.equal(vectors.vectors, model.params.w + model.params.c)
    # cat and dog share every context: they end nearer each other than either to "on"
    assert vectors.similarity("cat", "dog") > max(
        vectors.similarity("cat", "on"), vectors.similarity("dog", "on")
    )


def test_the_same_seed_starts_and_ends_alike() -> None:
    words, counts = count_words(TEXT, 1)
    config = GloveConfig(dim=4, window=2, min_count=1, epochs=3)
    ends = []
    for _ in range(2):
        pairs, _ = count_cooccurrences(TEXT, words, config)
        model = Glove(words, counts, config, seed=5)
        model.fit(pairs)
        ends.append(model.word_vectors().vectors)
    assert torch.equal(*ends)


def test_settings_are_checked_where_they_are_read() -> None:
    with pytest.raises(AttnkitError, match=r"glove\.window must be positive"):
        GloveConfig(window=0)
    with pytest.raises(AttnkitError, match=r"glove\.eta"):
        GloveConfig(eta=float("nan"))
