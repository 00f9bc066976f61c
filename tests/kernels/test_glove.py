"""GloVe's C loops against transcriptions of the paper: counts of a symmetric 1/distance window,
one AdaGrad step against autograd's gradient of the loss, a pass against a NumPy loop."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from attnkit.errors import AttnkitError
from attnkit.kernels import glove
from attnkit.kernels.glove import Cooccurrences, CountTable, Parameters


def _sentences(n: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 30, (n,), generator=g)
    # a skewed draw, so some pairs repeat often and most are rare
    return [(torch.rand(int(k), generator=g) ** 3 * vocab).long().tolist() for k in lengths]


def _as_corpus(sentences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([w for s in sentences for w in s], dtype=torch.long)
    starts = torch.tensor([0, *np.cumsum([len(s) for s in sentences])], dtype=torch.long)
    return ids, starts


def _reference_counts(sentences, window, symmetric, weighted) -> dict[tuple[int, int], float]:
    """X_ij: each word and each word up to `window` after it in its sentence, 1/k apart."""
    x: dict[tuple[int, int], float] = defaultdict(float)
    for s in sentences:
        for t, a in enumerate(s):
            for k in range(1, window + 1):
                if t + k >= len(s):
                    break
                b = s[t + k]
                x[a, b] += 1 / k if weighted else 1.0
                if symmetric:
                    x[b, a] += 1 / k if weighted else 1.0
    return x


def _as_dict(pairs: Cooccurrences) -> dict[tuple[int, int], float]:
    rows, cols, counts = pairs.rows.tolist(), pairs.cols.tolist(), pairs.counts.tolist()
    return {(r, c): x for r, c, x in zip(rows, cols, counts, strict=True)}


@pytest.mark.parametrize(("window", "symmetric", "weighted"), [
    (5, True, True), (3, False, True), (4, True, False), (1, True, True),
])  # fmt: skip
def test_counts_are_the_windows_of_each_sentence(window, symmetric, weighted) -> None:
    sentences = _sentences(300, 40, seed=window)
    table = CountTable(40, window, symmetric, weighted)
    # in three chunks, through several doublings of a table that starts small
    for part in (sentences[:100], sentences[100:101], sentences[101:]):
        table.add(*_as_corpus(part))
    got, expected = (
        _as_dict(table.pairs()),
        _reference_counts(sentences, window, symmetric, weighted),
    )
    assert table.capacity > 1024 and table.used == len(expected) <= 0.7 * table.capacity
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert math.isclose(got[key], value, rel_tol=1e-6)


def test_counting_refuses_ids_outside_the_vocabulary() -> None:
    table = CountTable(5, 2, True, True)
    with pytest.raises(AttnkitError, match="ids outside the 5 words"):
        table.add(torch.tensor([1, 5]), torch.tensor([0, 2]))
    with pytest.raises(AttnkitError, match="sentence starts must rise from 0"):
        table.add(torch.tensor([1, 2]), torch.tensor([0, 1]))


def test_shuffling_is_a_permutation_drawn_from_the_seed() -> None:
    table = CountTable(40, 5, True, True)
    table.add(*_as_corpus(_sentences(100, 40, seed=0)))
    pairs, other = table.pairs(), table.pairs()
    before = _as_dict(pairs)
    pairs.shuffle(3)
    other.shuffle(3)
    assert _as_dict(pairs) == before
    assert torch.equal(pairs.rows, other.rows) and torch.equal(pairs.counts, other.counts)
    other.shuffle(4)
    assert not torch.equal(pairs.rows, other.rows)


def _params(vocab: int, d: int, seed: int = 0) -> Parameters:
    g = torch.Generator().manual_seed(seed)
    return Parameters(
        torch.randn(vocab, d, generator=g) * 0.3, torch.randn(vocab, d, generator=g) * 0.3,
        torch.randn(vocab, generator=g) * 0.1, torch.randn(vocab, generator=g) * 0.1,
        torch.ones(vocab, d), torch.ones(vocab, d), torch.ones(vocab), torch.ones(vocab),
    )  # fmt: skip


def test_a_first_step_is_eta_times_autograds_gradient_of_the_weighted_squared_error() -> None:
    eta, x_max, alpha = 0.05, 10.0, 0.75
    for x in (3.0, 25.0):  # below and above x_max: f = (x / x_max)^alpha, then 1
        params = _params(4, 6)
        i, j = 1, 3
        leaves = {
            name: getattr(params, name).clone().requires_grad_() for name in ("w", "c", "bw", "bc")
        }
        w, c, bw, bc = leaves.values()
        f = min(1.0, (x / x_max) ** alpha)
        loss = 0.5 * f * (w[i] @ c[j] + bw[i] + bc[j] - math.log(x)) ** 2  # 0.5 J_ij
        loss.backward()
        pairs = Cooccurrences(torch.tensor([i], dtype=torch.int32),
                              torch.tensor([j], dtype=torch.int32), torch.tensor([x]))  # fmt: skip
        cost = glove.train(params, pairs, eta, x_max, alpha, threads=1)
        assert math.isclose(cost, loss.item(), rel_tol=1e-5)
        for name, leaf in leaves.items():
            # AdaGrad's accumulators start at 1: the first step is eta times the gradient
            moved = leaf.detach() - eta * leaf.grad
            torch.testing.assert_close(getattr(params, name), moved, atol=1e-6, rtol=1e-5)
        # and each accumulator has gained the square of its step
        torch.testing.assert_close(params.gw[i], 1 + (eta * w.grad[i]) ** 2)
        torch.testing.assert_close(params.gbc[j], 1 + (eta * bc.grad[j]) ** 2)


def _numpy_pass(p: dict[str, np.ndarray], rows, cols, counts, eta, x_max, alpha) -> float:
    """The paper's loss and gradients, and AdaGrad as the reference tool steps, one pair at a
    time, in float64."""
    cost = 0.0
    for i, j, x in zip(rows, cols, counts, strict=True):
        diff = p["w"][i] @ p["c"][j] + p["bw"][i] + p["bc"][j] - np.log(x)
        f = min(1.0, (x / x_max) ** alpha)
        cost += 0.5 * f * diff**2
        g = eta * f * diff  # the step's common factor: eta d(0.5 J_ij)/d(w_i . c_j)
        step_w = np.clip(g * p["c"][j], -100, 100)
        step_c = np.clip(g * p["w"][i], -100, 100)
        p["w"][i] -= step_w / np.sqrt(p["gw"][i])
        p["c"][j] -= step_c / np.sqrt(p["gc"][j])
        p["gw"][i] += step_w**2
        p["gc"][j] += step_c**2
        p["bw"][i] -= g / np.sqrt(p["gbw"][i])
        p["bc"][j] -= g / np.sqrt(p["gbc"][j])
        p["gbw"][i] += g**2
        p["gbc"][j] += g**2
    return cost


def test_a_pass_on_one_thread_is_the_numpy_transcription_step_for_step() -> None:
    table = CountTable(30, 4, True, True)
    table.add(*_as_corpus(_sentences(200, 30, seed=1)))
    pairs = table.pairs()
    pairs.shuffle(0)
    params = _params(30, 8)
    reference = {k: v.double().numpy().copy() for k, v in vars(params).items()}
    expected = _numpy_pass(
        reference, pairs.rows.tolist(), pairs.cols.tolist(), pairs.counts.double().tolist(),
        eta=0.05, x_max=5.0, alpha=0.75,
    )  # fmt: skip
    cost = glove.train(params, pairs, 0.05, 5.0, 0.75, threads=1)
    assert len(pairs) > 800
    assert math.isclose(cost, expected, rel_tol=1e-4)
    for name, value in reference.items():
        torch.testing.assert_close(
            getattr(params, name).double(), torch.from_numpy(value), atol=2e-4, rtol=1e-4
        )


def test_threads_share_the_pairs_and_still_descend() -> None:
    table = CountTable(30, 4, True, True)
    table.add(*_as_corpus(_sentences(400, 30, seed=2)))
    pairs = table.pairs()
    pairs.shuffle(0)
    params = _params(30, 8)
    costs = [glove.train(params, pairs, 0.05, 5.0, 0.75, threads=2) for _ in range(5)]
    assert costs == sorted(costs, reverse=True) and costs[-1] < 0.5 * costs[0]
    with pytest.raises(AttnkitError, match="1 thread or more"):
        glove.train(params, pairs, 0.05, 5.0, 0.75, threads=0)
