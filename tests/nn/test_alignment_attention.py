"""Location-aware (Chorowski et al. 2015) and monotonic attention (Raffel et al. 2017, MoChA):
the papers' recursions computed by hand, alignments that sum to at most 1, decoding that never
moves left, and the decode's state carrying each step's alignment, beams and all."""

import pytest
import torch

from attnkit import AttnkitError
from attnkit.generation import generate
from attnkit.models.decoding_state import DecodingState
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


ALIGNING = [
    {"attention_kind": "location-aware", "location_kernel": 3, "location_filters": 4},
    {"attention_kind": "monotonic", "monotonic_chunk": 3},
]


def aligning_model(changes: dict) -> torch.nn.Module:
    """A tiny model whose alignments depend on the step before: location-aware attention with
    its location term on (w starts at zero), monotonic attention with saturated stops (a
    large energy scale), so that hard decoding and the expectation agree; noise on every
    weight, so that beams part."""
    model = tiny_model(**changes).eval()
    attention = model.decoder.blocks[0].cross_attn
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.5)
        if changes["attention_kind"] == "monotonic":
            attention.q_proj.weight.mul_(1000)
        else:
            attention.location_weight.normal_(0, 3, generator=generator)
    return model


@pytest.mark.parametrize("changes", ALIGNING)
def test_decoding_on_the_cache_reads_what_teacher_forcing_reads(changes):
    """Greedy decoding carries each step's alignment in the decode's state; teacher forcing
    on its output makes the same alignments at once, so the logits agree (MoChA: soft chunks
    on saturated stops)."""
    model = aligning_model(changes)
    src, mask = padded_batch([7, 4], 7, vocab_size=24)
    out = generate(model, src, mask, max_new_tokens=6, decoder_start_token_id=1, eos_token_id=None)
    tgt = out.sequences[:, :-1]
    with torch.no_grad():
        forced = model(src, tgt, mask).logits.argmax(-1)
    assert torch.equal(forced, out.sequences[:, 1:])


@pytest.mark.parametrize("changes", ALIGNING)
def test_steps_on_the_cache_carry_the_alignment_as_one_call_over_the_prefix_does(changes):
    """Each step reads the alignment the step before left in the decode's state: one token a
    call gives the logits of the whole prefix in one call (whose queries align in turn), and
    for location-aware attention those of teacher forcing."""
    model = aligning_model(changes)
    src, mask = padded_batch([7, 4], 7, vocab_size=24)
    tgt = torch.randint(3, 24, (2, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        state = model.new_cache(src, mask, 5)
        steps = torch.stack([model.decode_step(tgt[:, i : i + 1], state) for i in range(5)], 1)
        prefixes = [
            model.decode_step(tgt[:, :n], model.new_cache(src, mask, n)) for n in range(1, 6)
        ]
        forced = model(src, tgt, mask).logits
    torch.testing.assert_close(steps, torch.stack(prefixes, 1), atol=1e-5, rtol=0)
    if changes["attention_kind"] == "location-aware":
        torch.testing.assert_close(steps, forced, atol=1e-5, rtol=0)


@pytest.mark.parametrize("changes", ALIGNING)
def test_beam_search_carries_each_beams_alignment_as_rerunning_the_prefix_does(changes):
    """Beams take their parents' alignments at every step (`DecodingState.reorder`): beam
    search on the cache picks the beams that rerunning each whole prefix picks."""
    model = aligning_model(changes)
    src, mask = padded_batch([7, 5, 6], 7, vocab_size=24)
    options = {"max_new_tokens": 6, "num_beams": 3, "num_return_sequences": 3}
    options |= {"decoder_start_token_id": 1, "eos_token_id": 2}
    cached = generate(model, src, mask, **options)
    rerun = generate(model, src, mask, use_cache=False, **options)
    assert torch.equal(cached.sequences, rerun.sequences)
    assert len({tuple(row) for row in cached.sequences.tolist()}) > 3  # the beams part
    torch.testing.assert_close(cached.sequences_scores, rerun.sequences_scores, atol=1e-5, rtol=0)


def test_decoding_without_the_decodes_alignment_state_is_refused():
    model = aligning_model(ALIGNING[0])
    src, mask = padded_batch([7, 4], 7, vocab_size=24)
    state = model.new_cache(src, mask, 4)
    with pytest.raises(AttnkitError, match="carry each step's alignment"):
        model.decode_step(torch.ones(2, 1, dtype=torch.long), DecodingState(state.kv_cache))


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
