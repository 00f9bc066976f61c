"""The pointer-generator: its mixture, its gate, its loss, and decoding through it."""

from __future__ import annotations

import pytest
import torch

from attnkit import EncoderDecoder
from attnkit.data.batch import Batch
from attnkit.errors import AttnkitError
from attnkit.generation import generate
from attnkit.interop import save_hf
from attnkit.run import load_pretrained, save_pretrained
from attnkit.train.cross_entropy import copy_cross_entropy
from attnkit.train.objectives import CopyObjective, objective_for
from tests.helpers import DECODING, tiny_config

V = DECODING["vocab_size"]
# Two sources with unknown words (ids V, V + 1 past the vocabulary of V), right-padded.
SRC = torch.tensor([[5, V, 6, V + 1, V, 2], [7, V, 2, 0, 0, 0]])
MASK = SRC != 0
# Teacher-forced targets: <s> then tokens, an extended id among them.
TGT = torch.tensor([[1, 5, V + 1, 6, V], [1, V, 8, 9, 10]])


def copy_model(attention: str = "mean", seed: int = 0) -> EncoderDecoder:
    torch.manual_seed(seed)
    config = tiny_config(
        **DECODING, copy_attention=attention, unk_id=3, eos_id=2, decoder_start_id=1
    )
    return EncoderDecoder(config).eval()


@pytest.mark.parametrize("attention", ["mean", "head"])
def test_the_mixture_is_a_distribution_over_the_extended_vocabulary(attention: str) -> None:
    log_p = copy_model(attention)(SRC, TGT, MASK).logits
    assert log_p.shape == (2, 5, V + 2)
    torch.testing.assert_close(log_p.exp().sum(-1), torch.ones(2, 5))


def test_with_p_gen_one_the_model_is_the_plain_one() -> None:
    model = copy_model()
    with torch.no_grad():
        model.copy.gate.weight.zero_()
        model.copy.gate.bias.fill_(100.0)  # sigmoid(100) is 1 in float32
    plain = EncoderDecoder(model.config.replace(copy_attention="none")).eval()
    weights = {k: v for k, v in model.state_dict().items() if not k.startswith("copy.")}
    plain.load_state_dict(weights)
    in_vocab = SRC.masked_fill(SRC >= V, 3), TGT.masked_fill(TGT >= V, 3)
    expected = plain(in_vocab[0], in_vocab[1], MASK).logits.log_softmax(-1)
    log_p = model(SRC, TGT, MASK).logits
    torch.testing.assert_close(log_p[..., :V], expected, atol=1e-5, rtol=1e-5)
    assert bool((log_p[..., V:] < -80).all())  # nothing left to copy with


def test_the_loss_of_an_unknown_target_in_the_source_is_minus_log_its_copy_probability() -> None:
    model = copy_model()
    out = model(SRC, TGT, MASK, cross_weights=[1])
    a = out.attentions["cross"][0].mean(1)  # (batch, T, S): the last layer, mean over heads
    memory = model.encode(SRC, MASK)
    inputs = model.tgt_embed.token(TGT.masked_fill(TGT >= V, 3))
    gate_in = torch.cat([a @ memory, out.hidden, inputs], -1)
    p_gen = torch.sigmoid(model.copy.gate(gate_in)).squeeze(-1)
    # Row 0 predicts V + 1 at its position 1: only copying can give it, from source position 3.
    targets = torch.full((2, 5), -100)
    targets[0, 1] = V + 1
    expected = (1 - p_gen[0, 1]) * a[0, 1, 3]
    terms = copy_cross_entropy(out.logits, targets, V)
    assert torch.isfinite(terms.loss) and int(terms.tokens) == 1
    torch.testing.assert_close(terms.loss, -expected.log(), atol=1e-5, rtol=1e-5)


def test_label_smoothing_spreads_over_the_vocabulary_not_the_extra_ids() -> None:
    log_p = copy_model()(SRC, TGT, MASK).logits
    targets = TGT[:, 1:].clone()
    terms = copy_cross_entropy(log_p[:, :4], targets, V, label_smoothing=0.1)
    logp = log_p[:, :4].flatten(0, 1)
    nll = -logp.gather(1, targets.flatten()[:, None]).squeeze(1)
    smooth = -logp[:, :V].mean(-1)
    torch.testing.assert_close(terms.loss, (0.9 * nll + 0.1 * smooth).sum())
    torch.testing.assert_close(terms.nll, nll.sum())


def test_the_objective_trains_the_gate_and_ignores_padding() -> None:
    model = copy_model().train()
    tgt_mask = torch.ones_like(TGT, dtype=torch.bool)
    tgt_mask[1, 3:] = False
    batch = Batch(SRC, MASK, TGT.masked_fill(~tgt_mask, 0), tgt_mask)
    objective = objective_for("encoder-decoder", 0.1, copy=True)
    assert isinstance(objective, CopyObjective)
    terms = objective(model, batch)
    assert int(terms.tokens) == 4 + 2
    terms.total.backward()
    assert model.copy.gate.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("num_beams", [1, 3])
def test_cached_and_uncached_decoding_agree(num_beams: int) -> None:
    model = copy_model(seed=3)
    options = {"max_new_tokens": 8, "num_beams": num_beams}
    cached = generate(model, SRC, MASK, **options)
    uncached = generate(model, SRC, MASK, use_cache=False, **options)
    torch.testing.assert_close(cached.sequences, uncached.sequences)


def copying_model(seed: int) -> EncoderDecoder:
    """A model that copies most of the time (p_gen near 0): copies are what it decodes."""
    model = copy_model(seed=seed)
    with torch.no_grad():
        model.copy.gate.bias.fill_(-4.0)
    return model


@pytest.mark.parametrize("num_beams", [1, 3])
def test_a_copying_model_decodes_each_sentence_as_alone_and_as_without_a_cache(num_beams) -> None:
    copied = False
    options = {"max_new_tokens": 6, "num_beams": num_beams}
    for seed in range(4):
        model = copying_model(seed)
        batch = generate(model, SRC, MASK, **options).sequences
        copied |= bool((batch >= V).any())
        uncached = generate(model, SRC, MASK, use_cache=False, **options).sequences
        torch.testing.assert_close(uncached, batch)
        for row in range(2):  # rows that finish early leave the cache (`reorder`, memory=True)
            n = int(MASK[row].sum())
            alone = generate(model, SRC[row : row + 1, :n], **options).sequences[0]
            assert batch[row, : len(alone)].tolist() == alone.tolist()
    assert copied  # unknown words were written, which only copying can do


def test_a_mixture_of_experts_keeps_its_load_balancing_loss_when_copying() -> None:
    torch.manual_seed(0)
    config = tiny_config(
        **DECODING, copy_attention="mean", unk_id=3, eos_id=2, decoder_start_id=1, n_experts=4
    )
    model = EncoderDecoder(config).train()
    terms = objective_for("encoder-decoder", copy=True)(model, Batch(SRC, MASK, TGT, None))
    assert terms.aux is not None and float(terms.aux.detach()) > 0


def test_each_cached_step_equals_the_full_forward_pass() -> None:
    model = copy_model(seed=1)
    full = model(SRC, TGT, MASK).logits
    cache = model.new_cache(SRC, MASK)
    for t in range(TGT.shape[1]):
        step = model.decode_step(TGT[:, t : t + 1], cache)
        torch.testing.assert_close(step, full[:, t], atol=1e-5, rtol=1e-5)


def test_beams_share_the_copy_source_of_their_sentence() -> None:
    # Beam search repeats the rows of a sentence over one copy of its memory (`group`).
    model = copy_model(seed=2)
    cache = model.new_cache(SRC, MASK)
    cache.repeat_rows(2)
    ids = TGT[:, :1].repeat_interleave(2, 0)
    grouped = model.decode_step(ids, cache)
    alone = model.decode_step(TGT[:, :1], model.new_cache(SRC, MASK))
    torch.testing.assert_close(grouped, alone.repeat_interleave(2, 0))


def test_a_copy_model_round_trips_through_a_run_folder_and_refuses_hugging_face(tmp_path) -> None:
    model = copy_model(seed=4)
    save_pretrained(model, tmp_path / "run")
    loaded = load_pretrained(tmp_path / "run")
    torch.testing.assert_close(loaded(SRC, TGT, MASK).logits, model(SRC, TGT, MASK).logits)
    with pytest.raises(AttnkitError, match="pointer-generator"):
        save_hf(model, tmp_path / "hf")


def test_a_pointer_needs_one_vocabulary_an_unk_id_and_a_source() -> None:
    with pytest.raises(AttnkitError, match=r"one\s+vocabulary"):
        tiny_config(copy_attention="mean", src_vocab_size=30, tie_embeddings="none", unk_id=3)
    with pytest.raises(AttnkitError, match="no source"):
        tiny_config("decoder", copy_attention="mean")
    with pytest.raises(AttnkitError, match="unk_id"):
        EncoderDecoder(tiny_config(copy_attention="mean"))
    model = copy_model()
    with pytest.raises(AttnkitError, match="src_ids"):
        model.decode(TGT, model.encode(SRC, MASK), MASK)
