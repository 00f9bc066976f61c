import math

import pytest
import torch

from attnkit.train import cross_entropy
from attnkit.train.cross_entropy import (
    IGNORE,
    chunked_cross_entropy,
    label_smoothed_cross_entropy,
    linear_cross_entropy,
)


def smoothed_by_definition(logits, targets, eps):
    """-sum_v q_v log p_v with q = (1 - eps) onehot + eps / V, summed over non-ignored targets."""
    total, nll, count = 0.0, 0.0, 0
    V = logits.shape[-1]
    for row, target in zip(
        logits.reshape(-1, V).tolist(), targets.reshape(-1).tolist(), strict=True
    ):
        if target == IGNORE:
            continue
        log_z = math.log(sum(math.exp(x) for x in row))
        logp = [x - log_z for x in row]
        q = [(1 - eps) * (v == target) + eps / V for v in range(V)]
        total += -sum(qv * lp for qv, lp in zip(q, logp, strict=True))
        nll += -logp[target]
        count += 1
    return total, nll, count


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("with_padding", [False, True])
def test_label_smoothing_matches_its_definition(eps, with_padding):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 7, generator=g, dtype=torch.float64) * 3
    targets = torch.randint(0, 7, (3, 5), generator=g)
    if with_padding:
        targets[0, 3:] = IGNORE
        targets[2, 1:] = IGNORE
    terms = label_smoothed_cross_entropy(logits, targets, eps)
    loss, nll, count = smoothed_by_definition(logits, targets, eps)
    assert int(terms.tokens) == count == (15 if not with_padding else 9)
    assert float(terms.loss) == pytest.approx(loss, rel=1e-6)
    assert float(terms.nll) == pytest.approx(nll, rel=1e-6)
    mean = torch.nn.functional.cross_entropy(
        logits.reshape(-1, 7), targets.reshape(-1), ignore_index=IGNORE, label_smoothing=eps
    )
    assert float(terms.loss) / count == pytest.approx(float(mean), rel=1e-6)


def _problem(with_padding: bool, with_bias: bool, dtype=torch.float64):
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(3, 7, 6, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(11, 6, generator=g, dtype=dtype, requires_grad=True)
    bias = torch.randn(11, generator=g, dtype=dtype, requires_grad=True) if with_bias else None
    targets = torch.randint(0, 11, (3, 7), generator=g)
    if with_padding:
        targets[0, 4:] = IGNORE
        targets[2, 1:] = IGNORE
    return hidden, weight, bias, targets


def _grads(terms, tensors):
    (2.5 * terms.loss).backward()  # a scale other than 1 checks that backward applies it
    grads = [None if t is None else t.grad.clone() for t in tensors]
    for t in tensors:
        if t is not None:
            t.grad = None
    return grads


@pytest.mark.parametrize("chunk_elements", [1 << 22, 33])  # one chunk; chunks of 3 rows
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("with_padding", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_loss_and_gradients_equal_the_plain_path(
    monkeypatch, chunk_elements, eps, with_padding, with_bias
):
    monkeypatch.setattr(cross_entropy, "CHUNK_ELEMENTS", chunk_elements)
    hidden, weight, bias, targets = _problem(with_padding, with_bias)
    tensors = [hidden, weight, bias]
    logits = hidden @ weight.t() + (0 if bias is None else bias)
    plain = label_smoothed_cross_entropy(logits, targets, eps)
    expected = _grads(plain, tensors)
    fused = linear_cross_entropy(hidden, weight, bias, targets, eps)
    assert int(fused.tokens) == int(plain.tokens) == (21 if not with_padding else 12)
    torch.testing.assert_close(fused.loss, plain.loss)
    torch.testing.assert_close(fused.nll, plain.nll)
    assert not fused.nll.requires_grad
    for got, want in zip(_grads(fused, tensors), expected, strict=True):
        torch.testing.assert_close(got, want)


def test_fused_loss_without_gradients_and_under_bf16_autocast():
    hidden, weight, bias, targets = _problem(True, True, torch.float32)
    with torch.no_grad():
        plain = label_smoothed_cross_entropy(hidden @ weight.t() + bias, targets, 0.1)
        fused = linear_cross_entropy(hidden, weight, bias, targets, 0.1)
    assert not fused.loss.requires_grad
    torch.testing.assert_close(fused.loss, plain.loss)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        terms = linear_cross_entropy(hidden, weight, bias, targets, 0.1)
    terms.loss.backward()
    assert terms.loss.dtype == torch.float32
    assert hidden.grad.dtype == weight.grad.dtype == bias.grad.dtype == torch.float32
    # bf16 products: the loss within bf16 rounding of the float32 one
    torch.testing.assert_close(terms.loss, plain.loss, rtol=2e-2, atol=0)


def test_fused_loss_with_a_frozen_head_gives_only_the_hidden_gradient():
    hidden, weight, bias, targets = _problem(True, True)
    weight.requires_grad_(False)
    bias.requires_grad_(False)
    plain = label_smoothed_cross_entropy(hidden @ weight.t() + bias, targets, 0.1)
    (expected,) = torch.autograd.grad(plain.loss, hidden)
    fused = linear_cross_entropy(hidden, weight, bias, targets, 0.1)
    (got,) = torch.autograd.grad(fused.loss, hidden)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("chunks", [1, 3, 8])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("with_padding", [False, True])
@pytest.mark.parametrize("recompute", [True, False])
def test_chunked_loss_and_gradients_equal_the_plain_path(chunks, eps, with_padding, recompute):
    hidden, weight, bias, targets = _problem(with_padding, True)
    tensors = [hidden, weight, bias]
    plain = label_smoothed_cross_entropy(hidden @ weight.t() + bias, targets, eps)
    expected = _grads(plain, tensors)
    chunked = chunked_cross_entropy(
        hidden, weight, bias, targets, eps, chunks=chunks, recompute=recompute
    )
    assert int(chunked.tokens) == int(plain.tokens)
    torch.testing.assert_close(chunked.loss, plain.loss)
    torch.testing.assert_close(chunked.nll, plain.nll)
    assert not chunked.nll.requires_grad
    for got, want in zip(_grads(chunked, tensors), expected, strict=True):
        torch.testing.assert_close(got, want)


def _largest_saved(loss_of) -> int:
    """Elements of the largest tensor autograd keeps for backward while `loss_of()` runs."""
    largest = 0

    def pack(t):
        nonlocal largest
        largest = max(largest, t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_of().loss.backward()
    return largest


def test_chunked_loss_never_keeps_the_whole_logits_under_bf16_autocast():
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(4, 32, 16, generator=g, requires_grad=True)
    weight = torch.randn(500, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 500, (4, 32), generator=g)
    whole = 4 * 32 * 500
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = _largest_saved(
            lambda: label_smoothed_cross_entropy(hidden @ weight.t(), targets, 0.1)
        )
        chunked = _largest_saved(
            lambda: chunked_cross_entropy(hidden, weight, None, targets, 0.1, chunks=8)
        )
        terms = chunked_cross_entropy(hidden, weight, None, targets, 0.1, chunks=8)
    assert plain >= whole  # the plain path keeps the (tokens, V) float32 log-probabilities
    assert chunked <= whole // 8  # one chunk's logits at most, recomputed in backward
    assert terms.loss.dtype == torch.float32
    with torch.no_grad():
        reference = label_smoothed_cross_entropy(hidden @ weight.t(), targets, 0.1)
    torch.testing.assert_close(terms.loss, reference.loss, rtol=2e-2, atol=0)
