"""The ModelConfig fields that express the families' differences, and what they build."""

from __future__ import annotations

import pytest
import torch
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

from attnkit import AttnkitError, ModelConfig, build_model
from attnkit.nn import sinusoidal_table
from attnkit.pooling import mean_pool

NEW_FIELDS = {
    "sinusoidal_layout": "interleaved",
    "n_token_types": 0,
    "embedding_norm": False,
    "logits_bias": False,
    "decoder_start_id": None,
    "eos_id": None,
}


def test_new_fields_default_to_the_previous_behaviour():
    config = ModelConfig.from_preset("tiny")
    assert {name: getattr(config, name) for name in NEW_FIELDS} == NEW_FIELDS
    model = build_model(config)
    assert model.head.bias is None
    assert model.src_embed.token_types is None and model.src_embed.norm is None


def test_new_fields_round_trip_through_json():
    config = ModelConfig.from_preset(
        "tiny",
        sinusoidal_layout="split",
        activation="silu",
        logits_bias=True,
        decoder_start_id=5,
        eos_id=2,
    )
    assert ModelConfig.from_json(config.to_json()) == config
    encoder = ModelConfig.from_preset("bert-mini", n_token_types=2, embedding_norm=True)
    assert ModelConfig.from_json(encoder.to_json()) == encoder


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"n_token_types": -1}, "n_token_types must be a non-negative integer"),
        ({"sinusoidal_layout": "zigzag"}, "sinusoidal_layout 'zigzag' is not one of"),
        ({"sinusoidal_layout": "split", "positional": "learned"}, "only applies to sinusoidal"),
        ({"eos_id": 64}, "eos_id 64 is outside the target vocabulary of 64"),
        ({"decoder_start_id": -1}, "decoder_start_id -1 is outside"),
        ({"activation": "tanh"}, "activation 'tanh' is not one of relu, gelu, gelu_tanh, silu"),
    ],
)
def test_bad_values_are_refused_in_one_sentence(changes, message):
    with pytest.raises(AttnkitError, match=message):
        ModelConfig.from_preset("tiny", **changes)


def test_an_encoder_has_no_decoder_start():
    with pytest.raises(AttnkitError, match="an encoder model has no decoder"):
        ModelConfig.from_preset("bert-mini", decoder_start_id=1)


@pytest.mark.parametrize("d_model", [16, 7])
def test_split_table_is_marians(d_model):
    marian = MarianSinusoidalPositionalEmbedding(40, d_model)
    torch.testing.assert_close(
        sinusoidal_table(40, d_model, "split"), marian.create_weight(), atol=1e-6, rtol=0
    )


def test_split_table_permutes_the_interleaved_one():
    split, interleaved = sinusoidal_table(9, 8, "split"), sinusoidal_table(9, 8)
    assert torch.equal(split, interleaved[:, [0, 2, 4, 6, 1, 3, 5, 7]])


def test_token_types_add_a_segment_vector():
    sizes = {"vocab_size": 50, "d_model": 32, "d_ff": 64, "max_len": 16}
    config = ModelConfig.from_preset("bert-mini", **sizes, n_token_types=2)
    model = build_model(config).eval()
    ids = torch.tensor([[3, 4, 5, 6]])
    first = torch.zeros_like(ids)
    assert torch.equal(model(ids).hidden, model(ids, token_types=first).hidden)
    assert not torch.allclose(model(ids).hidden, model(ids, token_types=first + 1).hidden)
    with pytest.raises(AttnkitError, match="token_types has shape \\(1, 3\\)"):
        model(ids, token_types=first[:, :3])
    with pytest.raises(AttnkitError, match="token id 2 is outside the vocabulary of 2"):
        model(ids, token_types=first + 2)


def test_mean_pool_ignores_padding():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[True, True, False]])
    assert torch.equal(mean_pool(hidden, mask), torch.tensor([[2.0, 3.0]]))
    with pytest.raises(AttnkitError, match="one mask value per token"):
        mean_pool(hidden, mask[:, :2])


def test_marians_activation_dropout_goes_both_ways():
    from attnkit.interop import marian

    config = ModelConfig.from_dict(
        {"shape": "encoder-decoder", "vocab_size": 40, "d_model": 16, "n_heads": 2, "d_ff": 32,
         "positional": "sinusoidal", "sinusoidal_layout": "split", "activation_dropout": 0.2}
    )  # fmt: skip
    hf = marian.config_to_hf(config)
    assert hf["activation_dropout"] == 0.2
    assert marian.config_from_hf(hf).activation_dropout == 0.2
