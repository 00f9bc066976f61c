"""Linformer: the layer computes eq. 7, ignores padding, shares as the paper's three levels
say, and is refused where it would see the future."""

import math

import pytest
import torch

from attnkit import AttnkitError, ModelConfig, build_model
from attnkit.nn.attention import AttentionInputs
from attnkit.nn.linformer import LinformerAttention, LinformerProjection
from tests.helpers import padded_batch, tiny_config, tiny_model


def layer(k: int = 4, max_len: int = 12, shared_kv: bool = False) -> LinformerAttention:
    torch.manual_seed(0)
    projection = LinformerProjection(k, max_len, shared_kv)
    return LinformerAttention(16, 2, projection).eval()


def test_the_layer_computes_the_papers_equation():
    attention = layer()
    x = torch.randn(3, 9, 16)
    q, k, v = attention.qkv_proj(x).split(16, dim=-1)
    e, f = attention.projection.e[:, :9], attention.projection.f[:, :9]
    heads = []
    for h in range(2):
        part = slice(8 * h, 8 * h + 8)
        scores = q[..., part] @ (e @ k[..., part]).transpose(-2, -1) / math.sqrt(8)
        heads.append(scores.softmax(-1) @ (f @ v[..., part]))
    expected = attention.out_proj(torch.cat(heads, -1))
    out, weights = attention(x, need_weights=True)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    assert weights.shape == (3, 2, 9, 4)  # n queries over k projected keys


def test_padding_does_not_change_a_sequences_output():
    attention = layer()
    x = torch.randn(2, 9, 16)
    mask = torch.arange(9)[None] < torch.tensor([[5], [9]])
    padded, _ = attention(x, AttentionInputs(key_mask=mask))
    alone, _ = attention(x[:1, :5])
    torch.testing.assert_close(padded[0, :5], alone[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("sharing", "matrices"), [("headwise", 4), ("key-value", 2), ("layerwise", 1)]
)
def test_the_three_levels_of_sharing(sharing, matrices):
    config = tiny_config(
        "encoder", 2, attention_kind="linformer", linformer_k=8, linformer_sharing=sharing
    )
    model = build_model(config)
    projections = [p for n, p in model.named_parameters() if ".projection." in n]
    assert len(projections) == matrices  # 2 layers: E and F each, one each, or one in all
    ids, mask = padded_batch([7, 4], 7, vocab_size=24)
    assert model(ids, mask).hidden.shape == (2, 7, 16)


def test_an_encoder_decoder_keeps_full_attention_in_its_decoder():
    model = tiny_model(attention_kind="linformer", linformer_k=8)
    assert isinstance(model.encoder.blocks[0].self_attn, LinformerAttention)
    assert not isinstance(model.decoder.blocks[0].self_attn, LinformerAttention)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"shape": "decoder", "tie_embeddings": "decoder", "n_decoder_layers": 1}, "future"),
        ({"positional": "rope"}, "no distance between a query and a key"),
        ({"linformer_k": 64}, "between 1 and max_len 32"),
        ({"linformer_sharing": "all"}, "linformer_sharing 'all' is not one of"),
    ],
)
def test_linformer_is_refused_where_it_cannot_work(changes, message):
    fields = {
        "shape": "encoder",
        "n_encoder_layers": 1,
        "n_decoder_layers": 0,
        "tie_embeddings": "decoder",
        "linformer_k": 8,
        **changes,
    }
    with pytest.raises(AttnkitError, match=message):
        ModelConfig(
            vocab_size=24, d_model=16, n_heads=2, max_len=32, attention_kind="linformer", **fields
        )


def test_a_sequence_longer_than_the_projections_is_refused():
    with pytest.raises(AttnkitError, match="cover 12 positions"):
        layer()(torch.randn(1, 13, 16))
