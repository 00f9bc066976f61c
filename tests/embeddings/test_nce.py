"""Noise-contrastive estimation (`word2vec.objective = "nce"`): the C loop's step against the
gradient of a NumPy transcription of Mnih and Teh's objective, and a run that uses it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from attnkit.embeddings.word2vec import (
    Word2Vec,
    Word2VecConfig,
    count_words,
    nce_offsets,
    noise_distribution,
)
from attnkit.errors import AttnkitError
from attnkit.kernels import sgns
from attnkit.train.run_config import RunConfig
from attnkit.train.tasks import train


def nce_loss(
    v_in: np.ndarray,
    v_out: np.ndarray,
    inputs: list[int],
    target: int,
    noise_words: list[int],
    q: np.ndarray,
) -> float:
    """Mnih and Teh (2012), eq. 6-8, as written: P(D = 1 | w, h) = p(w | h) / (p(w | h) + k q(w))
    with p(w | h) = exp(v'_w . h) unnormalised; the data word against k noise draws."""
    k = len(noise_words)
    h = v_in[inputs].mean(axis=0)

    def from_data(word: int) -> float:
        p = np.exp(v_out[word] @ h)
        return p / (p + k * q[word])

    return -np.log(from_data(target)) - sum(np.log(1 - from_data(n)) for n in noise_words)


def numerical_gradient(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        saved = x[index]
        x[index] = saved + eps
        up = f()
        x[index] = saved - eps
        down = f()
        x[index] = saved
        grad[index] = (up - down) / (2 * eps)
    return grad


@pytest.mark.parametrize(
    ("inputs", "target", "noise_words"),
    [([0], 1, [2, 3, 4]), ([0, 2, 5], 1, [3, 4]), ([5], 2, [2, 0, 4])],  # the last draws w
)
def test_an_nce_step_is_minus_alpha_times_the_gradient_of_the_objective(
    inputs: list[int], target: int, noise_words: list[int]
) -> None:
    rng = np.random.default_rng(0)
    vocab, dim, alpha = 6, 4, 1e-3
    v_in, v_out = rng.normal(size=(vocab, dim)), rng.normal(size=(vocab, dim)) * 0.5
    q = rng.dirichlet(np.ones(vocab))
    k = len(noise_words)
    vectors = sgns.Vectors(torch.tensor(v_in, dtype=torch.float32), torch.tensor(v_out).float())
    v_in, v_out = vectors.inputs.double().numpy().copy(), vectors.outputs.double().numpy().copy()
    offsets = nce_offsets(torch.tensor(q), k)
    np.testing.assert_allclose(offsets.numpy(), np.log(k * q), rtol=1e-6)

    loss = sgns.update(
        vectors, torch.tensor(inputs), target, torch.tensor(noise_words), alpha, offsets
    )

    def objective() -> float:
        return nce_loss(v_in, v_out, inputs, target, noise_words, q)

    # a draw of the true word reads its output vector after the target's step: an O(alpha) change
    assert loss == pytest.approx(objective(), rel=1e-5 if target not in noise_words else 1e-3)
    grad_in, grad_out = numerical_gradient(objective, v_in), numerical_gradient(objective, v_out)
    # CBOW's context words each get the whole step of h (word2vec's rule, not d loss / d v_c,
    # which is that step over the context's size): compare with the gradient in h.
    per_input = len(inputs)
    expected_in = v_in - alpha * grad_in * per_input
    # that moved vector changes the steps by O(alpha^2), far below the tolerance
    np.testing.assert_allclose(
        vectors.outputs.double().numpy(), v_out - alpha * grad_out, atol=2e-6
    )
    np.testing.assert_allclose(vectors.inputs.double().numpy(), expected_in, atol=2e-6)


def test_negative_sampling_is_nce_without_the_offsets() -> None:
    torch.manual_seed(1)
    both = [sgns.Vectors(torch.randn(5, 3), torch.randn(5, 3)) for _ in range(2)]
    both[1] = sgns.Vectors(both[0].inputs.clone(), both[0].outputs.clone())
    args = (torch.tensor([0]), 1, torch.tensor([2, 3]), 0.1)
    sgns.update(both[0], *args)
    sgns.update(both[1], *args, offsets=torch.zeros(5))
    torch.testing.assert_close(both[0].inputs, both[1].inputs)
    torch.testing.assert_close(both[0].outputs, both[1].outputs)


def test_offsets_of_the_wrong_size_are_refused() -> None:
    vectors = sgns.Vectors(torch.randn(5, 3), torch.randn(5, 3))
    with pytest.raises(AttnkitError, match="one offset"):
        sgns.update(vectors, torch.tensor([0]), 1, torch.tensor([2]), 0.1, torch.zeros(4))


def test_an_unknown_objective_is_refused() -> None:
    with pytest.raises(AttnkitError, match="objective"):
        Word2VecConfig(objective="hierarchical-softmax")


def test_nce_makes_exp_scores_near_normalised_where_negative_sampling_does_not() -> None:
    """NCE's point (Mnih and Teh, section 3): exp(v'_w . h) learns p(w | h) itself, so summed
    over the vocabulary it comes near 1 for a context; negative sampling's has no such scale."""
    g = torch.Generator().manual_seed(0)
    words = [f"w{i}" for i in range(30)]
    ranks = torch.arange(1, 31, dtype=torch.float64)
    draws = torch.multinomial(1 / ranks, 60_000, replacement=True, generator=g)
    sentences = [[words[i] for i in row] for row in draws.view(-1, 10).tolist()]
    totals = {}
    for objective in ("negative-sampling", "nce"):
        config = Word2VecConfig(
            dim=10, window=2, negative=10, sample=0, min_count=1, epochs=2, objective=objective
        )
        vocab, counts = count_words(sentences, 1)
        model = Word2Vec(vocab, counts, config, seed=1)
        model.fit(model.encode(sentences))
        scores = model.vectors.inputs.double() @ model.vectors.outputs.double().T
        totals[objective] = float(scores.exp().sum(-1).median())
    assert 0.5 < totals["nce"] < 2.0
    assert not 0.5 < totals["negative-sampling"] < 2.0
    assert noise_distribution(counts).sum() == pytest.approx(1.0)


def test_a_run_config_trains_by_nce(tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(8, (2000, 8), generator=g).tolist()
    text.write_text("\n".join(" ".join(f"w{i}" for i in row) for row in rows) + "\n")
    config = RunConfig.from_dict(
        {
            "data": {"task": "word2vec", "corpus": str(text)},
            "word2vec": {"dim": 8, "min_count": 1, "epochs": 1, "objective": "nce"},
            "train": {"out_dir": str(tmp_path / "run"), "threads": 1, "seed": 3},
        }
    )
    result = train(config)
    assert result.stopped == "finished"
    assert result.model.sampling.offsets is not None
    assert result.model.config.objective == "nce"
