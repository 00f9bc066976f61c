"""word2vec: its distributions against their formulas, one update of the C loop against a hand
computation, the corpus in chunks, and vectors that learn which words go together."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from attnkit.embeddings import word2vec
from attnkit.embeddings.word2vec import (
    AliasTable,
    Progress,
    Word2Vec,
    Word2VecConfig,
    count_words,
    keep_probabilities,
    noise_distribution,
)
from attnkit.errors import AttnkitError
from attnkit.kernels import sgns

COUNTS = torch.tensor([5000.0, 300.0, 40.0, 7.0, 1.0])


def test_noise_distribution_is_counts_to_the_three_quarters() -> None:
    expected = [c**0.75 / sum(x**0.75 for x in COUNTS.tolist()) for c in COUNTS.tolist()]
    assert noise_distribution(COUNTS).tolist() == pytest.approx(expected, rel=1e-12)


def test_subsampling_keeps_a_word_as_the_c_tool_does() -> None:
    t, total = 1e-3, float(COUNTS.sum())
    expected = [min(1.0, (math.sqrt(c / (t * total)) + 1) * t * total / c) for c in COUNTS.tolist()]
    got = keep_probabilities(COUNTS, t)
    assert got.tolist() == pytest.approx(expected, rel=1e-12)
    assert got[0] < 1 and got[-1] == 1  # the frequent word is thinned, the rare one kept
    assert keep_probabilities(COUNTS, 0).tolist() == [1.0] * 5


def test_the_alias_table_draws_the_noise_distribution_exactly() -> None:
    probs = noise_distribution(COUNTS)
    table = AliasTable(probs)
    assert table.probabilities().tolist() == pytest.approx(probs.tolist(), abs=1e-15)
    draws = sgns.draw(table.own, table.alias, 200_000, seed=0)  # the C loop's own sampler
    freq = torch.bincount(draws, minlength=5).double() / len(draws)
    assert freq.tolist() == pytest.approx(probs.tolist(), abs=4e-3)


def test_words_are_counted_most_frequent_first_and_rare_ones_dropped() -> None:
    words, counts = count_words([["b", "a", "c"], ["a", "b", "d", "a"]], min_count=2)
    assert words == ["a", "b"] and counts.tolist() == [3.0, 2.0]
    with pytest.raises(AttnkitError, match="no word occurs 9 times"):
        count_words([["a"]], min_count=9)


def _vectors() -> sgns.Vectors:
    torch.manual_seed(5)
    return sgns.Vectors(torch.randn(4, 3), torch.randn(4, 3))


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1 / (1 + torch.exp(-x))


def _expected(
    v_in: torch.Tensor,
    v_out: torch.Tensor,
    h: torch.Tensor,
    target: int,
    negatives: list[int],
    lr: float,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The hand computation: new output vectors, h's step and the loss."""
    out, step_h, loss = v_out.clone(), torch.zeros_like(h), 0.0
    for word, label in [(target, 1.0)] + [(n, 0.0) for n in negatives if n != target]:
        p = _sigmoid(v_out[word] @ h)
        loss -= math.log(p if label else 1 - p)
        g = lr * (label - p)
        step_h += g * v_out[word]
        out[word] += g * h
    return out, step_h, loss


@pytest.mark.parametrize("negatives", [[2, 3], [1, 3]])  # the second draws the true word
def test_one_skip_gram_update_equals_a_hand_computation(negatives: list[int]) -> None:
    vectors = _vectors()
    v_in, v_out = vectors.inputs.double().clone(), vectors.outputs.double().clone()
    # the context word w0's input vector predicts the centre w1
    loss = sgns.update(vectors, torch.tensor([0]), 1, torch.tensor(negatives), 0.1)
    out, step_h, expected_loss = _expected(v_in, v_out, v_in[0], 1, negatives, 0.1)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    assert torch.allclose(vectors.outputs.double(), out, atol=1e-6)
    assert torch.allclose(vectors.inputs[0].double(), v_in[0] + step_h, atol=1e-6)
    assert torch.equal(vectors.inputs[1:].double(), v_in[1:])


def test_one_cbow_update_equals_a_hand_computation() -> None:
    vectors = _vectors()
    v_in, v_out = vectors.inputs.double().clone(), vectors.outputs.double().clone()
    # the centre w2 with the context w0, w1, w1
    loss = sgns.update(vectors, torch.tensor([0, 1, 1]), 2, torch.tensor([3, 0]), 0.05)
    h = (v_in[0] + 2 * v_in[1]) / 3
    out, step_h, expected_loss = _expected(v_in, v_out, h, 2, [3, 0], 0.05)
    expected_in = v_in.clone()
    expected_in[0] += step_h  # every context word gets the whole step, once per occurrence
    expected_in[1] += 2 * step_h
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    assert torch.allclose(vectors.outputs.double(), out, atol=1e-6)
    assert torch.allclose(vectors.inputs.double(), expected_in, atol=1e-6)


def test_sentences_become_one_row_cut_at_the_longest_sentence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = Word2Vec(["a", "b"], torch.tensor([3.0, 2.0]), Word2VecConfig(min_count=1))
    monkeypatch.setattr(word2vec, "MAX_SENTENCE", 2)
    corpus = model.encode([["a", "x", "b", "a"], ["y"], ["b"]])
    assert corpus.ids.tolist() == [0, 1, 0, 1]
    assert corpus.starts.tolist() == [0, 2, 3, 4]
    part = corpus.slice(1, 3)
    assert part.ids.tolist() == [0, 1] and part.starts.tolist() == [0, 1, 2]


def test_chunks_cover_every_epoch_with_a_falling_rate() -> None:
    config = Word2VecConfig(min_count=1, epochs=2, alpha=0.02, min_alpha=0.0)
    model = Word2Vec(["a", "b"], torch.tensor([3.0, 2.0]), config)
    corpus = model.encode([["a", "b", "a"], ["b"], ["a", "a"], ["b", "b", "b"]])
    chunks = list(model.chunks(corpus, chunk_words=3))
    assert [c.corpus.words for c in chunks] == [3, 3, 3, 3, 3, 3]
    assert [c.epoch for c in chunks] == [0, 0, 0, 1, 1, 1]
    assert chunks[0].alphas == pytest.approx((0.02, 0.02 * (1 - 3 / 18)))
    assert all(a.alphas[1] == pytest.approx(b.alphas[0]) for a, b in itertools.pairwise(chunks))
    assert chunks[-1].alphas[1] == pytest.approx(0.0) and chunks[-1].words_done == 18
    assert len({c.seed for c in chunks}) == 6


def _topic_corpus(sentences: int = 600) -> tuple[list[list[str]], list[list[str]]]:
    g = torch.Generator().manual_seed(0)
    topics = [[f"animal{i}" for i in range(6)], [f"city{i}" for i in range(6)]]
    corpus = [
        [topics[t][int(i)] for i in torch.randint(6, (8,), generator=g)]
        for t in torch.randint(2, (sentences,), generator=g).tolist()
    ]
    return topics, corpus


@pytest.mark.parametrize(
    ("architecture", "threads"), [("skip-gram", 1), ("cbow", 1), ("skip-gram", 2)]
)
def test_training_brings_words_of_one_topic_together(architecture: str, threads: int) -> None:
    topics, corpus = _topic_corpus()
    config = Word2VecConfig(architecture=architecture, dim=16, window=3, min_count=1, sample=0)
    model = Word2Vec(*count_words(corpus, 1), config)
    chunks: list[Progress] = []
    model.fit(model.encode(corpus), threads=threads, chunk_words=1000, on_chunk=chunks.append)
    assert len(chunks) == 5 * 5 and chunks[-1].words_done == 5 * 4800
    assert chunks[-1].loss < 0.8 * chunks[0].loss
    vectors = model.word_vectors()
    assert vectors.similarity("animal0", "animal1") > vectors.similarity("animal0", "city1") + 0.3
    assert {w for w, _ in vectors.nearest("city2", k=5)} == set(topics[1]) - {"city2"}


def test_one_thread_trains_the_same_vectors_twice() -> None:
    _, corpus = _topic_corpus(100)
    runs = []
    for _ in range(2):
        model = Word2Vec(*count_words(corpus, 1), Word2VecConfig(dim=8, min_count=1))
        model.fit(model.encode(corpus))
        runs.append(model.vectors.inputs)
    assert torch.equal(*runs)


def test_bad_settings_say_which() -> None:
    with pytest.raises(AttnkitError, match="is not one of skip-gram, cbow"):
        Word2VecConfig(architecture="glove")
    with pytest.raises(AttnkitError, match=r"word2vec\.window must be positive"):
        Word2VecConfig(window=0)
    with pytest.raises(AttnkitError, match=r"must not exceed word2vec\.alpha"):
        Word2VecConfig(alpha=0.01, min_alpha=0.1)


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_every_thread_count_makes_each_update_once(threads: int) -> None:
    # window 1, no subsampling: skip-gram updates 2 (n - 1) times a sentence, CBOW n times
    sentences = [[f"w{i % 7}" for i in range(n)] for n in (1, 2, 5, 9, 3, 30, 4, 2, 11)]
    for architecture, expected in (("skip-gram", 2 * (67 - 9)), ("cbow", 67 - 1)):
        config = Word2VecConfig(architecture=architecture, window=1, sample=0, min_count=1)
        model = Word2Vec(*count_words(sentences, 1), config)
        _, updates = model.train_pass(
            model.encode(sentences), (0.025, 0.0), seed=0, threads=threads
        )
        assert updates == expected


def test_the_c_loop_refuses_what_it_cannot_index() -> None:
    vectors = _vectors()
    with pytest.raises(AttnkitError, match="at least one input word"):
        sgns.update(vectors, torch.tensor([], dtype=torch.long), 1, torch.tensor([2]), 0.1)
    with pytest.raises(AttnkitError, match="target holds ids outside the 4 words"):
        sgns.update(vectors, torch.tensor([0]), 4, torch.tensor([2]), 0.1)
    model = Word2Vec(["a", "b"], torch.tensor([2.0, 1.0]), Word2VecConfig(min_count=1))
    corpus = model.encode([["a", "b"]])
    with pytest.raises(AttnkitError, match="1 thread or more"):
        model.train_pass(corpus, (0.1, 0.1), seed=0, threads=0)
    with pytest.raises(AttnkitError, match="sentence starts must rise"):
        sgns.train(
            model.vectors, corpus.ids, torch.tensor([0, 1]), model.sampling, (0.1, 0.1), 0, 1
        )


def test_an_empty_corpus_is_named_empty_not_a_min_count_to_lower() -> None:
    """It suggested lowering min_count below 1 (issue 39, POOR: misleading messages)."""
    with pytest.raises(AttnkitError, match=r"^the corpus holds no words; give a text"):
        count_words([[], []], 1)
    with pytest.raises(AttnkitError, match="no word occurs 3 times or more; lower"):
        count_words([["a", "b"]], 3)
