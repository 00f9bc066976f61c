"""Location-aware (Chorowski et al. 2015) and monotonic attention (Raffel et al. 2017, MoChA):
the papers' recursions computed by hand, alignments that sum to at most 1, decoding that never
moves left, and the KV cache carrying each step's alignment."""

import pytest
import torch

from attnkit import AttnkitError
from attnkit.generation import generate
from attnkit.nn.attention import AttentionInputs
from attnkit.nn.location_attention import LocationAwareAttention
from attnkit.nn.monotonic_attention import (
    MonotonicAttention,
    chunk_expectation,
    expected_alignment,
)
from tests.helpers import padded_batch, tiny_config, tiny_model


def by_recursion(e: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """Raffel et al.'s eq. 10-11 in loops: q_j = (1 - p_{j-1}) q_{j-1} + alpha_{i-1,j},
    alpha_{i,j} = p_j q_j."""
    p = torch.sigmoid(e.double())
    out = torch.zeros_like(p)
    prev = previous.double()
    for i in range(e.shape[-2]):
        q = torch.zeros_like(prev)
        for j in range(e.shape[-1]):
            carried = (1 - p[..., i, j - 1]) * q[..., j - 1] if j else 0.0
            q[..., j] = carried + prev[..., j]
        prev = p[..., i, :] * q
        out[..., i, :] = prev
    return out


def test_the_expected_alignment_is_the_papers_recursion_and_sums_to_at_most_one():
    torch.manual_seed(0)
    e = torch.randn(2, 3, 5, 7) * 3
    start = torch.zeros(2, 3, 7)
    start[..., 0] = 1
    alpha = expected_alignment(e, start)
    torch.testing.assert_close(alpha.double(), by_recursion(e, start), atol=1e-6, rtol=0)
    sums = alpha.sum(-1)
    assert (sums <= 1 + 1e-6).all() and (sums < 0.999).any()  # some mass passes the end


def test_saturated_energies_make_the_expectation_the_hard_decision():
    # Where every p is 0 or 1, training's expectation and decoding's choice agree.
    torch.manual_seed(1)
    e = torch.where(torch.randn(1, 2, 6, 8) > 0.3, 60.0, -60.0)
    layer = MonotonicAttention(16, 2)
    start = torch.zeros(1, 2, 8)
    start[..., 0] = 1
    soft = expected_alignment(e, start)
    hard, _ = layer._hard(e, None, torch.ones(1, 8, dtype=torch.bool), torch.zeros(1, 2).long())
    torch.testing.assert_close(soft, hard)


def test_hard_decoding_never_moves_left():
    torch.manual_seed(2)
    layer = MonotonicAttention(16, 2)
    e = torch.randn(3, 2, 12, 9)
    weights, _ = layer._hard(e, None, torch.ones(3, 9, dtype=torch.bool), torch.zeros(3, 2).long())
    chosen = torch.where(weights.sum(-1) > 0, weights.argmax(-1), 9)  # 9: passed the end
    assert (chosen.diff(dim=-1) >= 0).all()
    assert ((weights.sum(-1) == 1) | (weights.sum(-1) == 0)).all()  # one position, or none


def test_mocha_is_the_papers_chunk_expectation():
    torch.manual_seed(3)
    alpha = torch.rand(2, 2, 4, 6) / 6
    u = torch.randn(2, 2, 4, 6)
    w = 3
    beta = chunk_expectation(alpha, u, w)
    expected = torch.zeros_like(beta)
    for k in range(6):
        for j in range(k, min(k + w, 6)):
            window = u[..., max(0, j - w + 1) : j + 1].exp().sum(-1)
            expected[..., k] += alpha[..., j] * u[..., k].exp() / window
    torch.testing.assert_close(beta, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(beta.sum(-1), alpha.sum(-1), atol=1e-6, rtol=0)  # mass kept


def test_location_aware_attention_is_the_papers_score():
    torch.manual_seed(4)
    layer = LocationAwareAttention(16, 2, filters=3, kernel=5).eval()
    torch.nn.init.normal_(layer.location_weight)
    x, memory = torch.randn(2, 4, 16), torch.randn(2, 6, 16)
    _, weights = layer(x, AttentionInputs(memory=memory), need_weights=True)
    q = layer._heads(layer.q_proj(x), 2)
    k, _ = layer.memory_kv(memory)
    scores = q @ k.transpose(-2, -1) / 8**0.5
    previous = torch.zeros(2, 2, 6)
    previous[..., 0] = 1
    for i in range(4):
        f = layer.location_conv(previous).unflatten(1, (2, 3)).tanh()  # F * alpha_{i-1} + b
        location = (f * layer.location_weight[None, :, :, None]).sum(2)  # w^T tanh(...)
        previous = (scores[:, :, i] + location).softmax(-1)
        torch.testing.assert_close(weights[:, :, i], previous, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "changes",
    [
        {"attention_kind": "location-aware", "location_kernel": 3, "location_filters": 4},
        {"attention_kind": "monotonic", "monotonic_chunk": 3},
    ],
)
def test_decoding_on_the_cache_reads_what_teacher_forcing_reads(changes):
    """Greedy decoding carries each step's alignment in the KV cache; teacher forcing on its
    output makes the same alignments at once, so the logits agree (MoChA: soft chunks
    on saturated stops, made so by a large energy scale)."""
    model = tiny_model(**changes).eval()
    if changes["attention_kind"] == "monotonic":
        with torch.no_grad():
            model.decoder.blocks[0].cross_attn.q_proj.weight.mul_(200)
    src, mask = padded_batch([7, 4], 7, vocab_size=24)
    out = generate(model, src, mask, max_new_tokens=6, decoder_start_token_id=1, eos_token_id=None)
    tgt = out.sequences[:, :-1]
    with torch.no_grad():
        forced = model(src, tgt, mask).logits.argmax(-1)
    assert torch.equal(forced, out.sequences[:, 1:])


def test_monotonic_training_sends_gradients_to_every_part():
    model = tiny_model(attention_kind="monotonic", monotonic_chunk=2).train()
    src, mask = padded_batch([7, 4], 7, vocab_size=24)
    tgt, tgt_mask = padded_batch([5, 3], 5, vocab_size=24)
    model(src, tgt, mask, tgt_mask).logits.sum().backward()
    attention = model.decoder.blocks[0].cross_attn
    for p in (attention.energy_bias, attention.chunk_q_proj.weight, attention.kv_proj.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"shape": "decoder", "tie_embeddings": "decoder"}, "only an encoder-decoder"),
        ({"copy_attention": "mean"}, "use one of them"),
        ({"location_kernel": 4}, "must be odd"),
    ],
)
def test_alignment_attention_is_refused_where_it_cannot_work(changes, message):
    kind = {"attention_kind": "location-aware"}
    with pytest.raises(AttnkitError, match=message):
        tiny_config(changes.pop("shape", "encoder-decoder"), **kind, **changes)
