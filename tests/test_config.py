"""ModelConfig: presets, JSON round trip, resolution of defaults, validation."""

import dataclasses

import pytest

from attnkit import PRESETS, AttnkitError, ModelConfig, build_model


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_valid_and_round_trips_through_json(name: str) -> None:
    config = ModelConfig.from_preset(name)
    assert ModelConfig.from_json(config.to_json()) == config


def test_json_file_round_trip(tmp_path) -> None:
    config = ModelConfig.from_preset("gpt-tiny", n_kv_heads=2)
    path = tmp_path / "config.json"
    config.to_json(path)
    assert ModelConfig.from_json(path) == config


def test_defaults_are_resolved_so_the_saved_config_is_explicit() -> None:
    config = ModelConfig(
        shape="decoder", n_decoder_layers=3, norm_position="pre", tie_embeddings="decoder"
    )
    assert (config.n_kv_heads, config.n_encoder_layers, config.final_norm) == (8, 0, True)
    assert config.src_vocab_size is None
    paper = ModelConfig()
    assert (paper.n_encoder_layers, paper.n_decoder_layers, paper.final_norm) == (6, 6, False)
    assert paper.src_vocab_size == paper.vocab_size
    assert paper.d_head == 64


def test_config_is_frozen_and_replace_validates() -> None:
    config = ModelConfig.from_preset("tiny")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 64  # type: ignore[misc]
    assert config.replace(n_heads=2).n_kv_heads == 2  # still multi-head: derived again
    assert config.replace(n_heads=2, n_kv_heads=1).n_kv_heads == 1
    gqa = config.replace(n_kv_heads=2)
    assert gqa.replace(d_model=64).n_kv_heads == 2  # chosen, not derived: kept
    with pytest.raises(AttnkitError, match="not divisible"):
        config.replace(n_heads=5)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"d_model": 500, "n_heads": 8}, "d_model 500 is not divisible by n_heads 8"),
        ({"n_kv_heads": 3}, "n_kv_heads 3 must divide n_heads 8"),
        ({"shape": "seq2seq"}, "shape 'seq2seq' is not one of"),
        ({"activation": "tanh"}, "activation 'tanh' is not one of"),
        ({"positional": "rotary"}, "positional 'rotary' is not one of"),
        ({"dropout": 1.5}, r"dropout must be in \[0, 1\)"),
        ({"vocab_size": 0}, "vocab_size must be a positive integer"),
        ({"src_vocab_size": 100}, "tie_embeddings 'all' needs one shared vocabulary"),
        (
            {"shape": "decoder", "n_encoder_layers": 6, "tie_embeddings": "decoder"},
            "a decoder model has no encoder: set n_encoder_layers to 0",
        ),
        ({"shape": "decoder"}, "tie_embeddings 'all' needs a source and a target side"),
        ({"n_decoder_layers": 0}, "needs n_decoder_layers >= 1"),
        ({"pad_id": 40000}, "pad_id 40000 is outside the vocabulary"),
        ({"norm_eps": 0.0}, "norm_eps must be positive"),
        ({"attention_window": -1}, "attention_window must be a non-negative integer"),
        ({"attention_stride": 4}, "attention_stride adds strided keys to a local window"),
        ({"positional": "rope", "d_model": 36, "n_heads": 4}, "d_head 9 is odd"),
        ({"positional": "rope", "rope_scaling": 0.5}, "rope_scaling at least 1"),
        ({"rope_theta": 500.0}, "the rope_ settings only apply to RoPE"),
        ({"rope_scaling_type": "linear"}, "the rope_ settings only apply to RoPE"),
        ({"positional": "rope", "rope_scaling_type": "yarn"}, "'yarn' is not one of ntk"),
        (
            {"positional": "rope", "rope_scaling_type": "llama3"},
            "rope_original_max_len .* is what llama3 scaling needs",
        ),
        (
            {"positional": "rope", "rope_original_max_len": 8192},
            "set both or neither, got rope_scaling_type 'ntk'",
        ),
        ({"n_experts": 4, "n_experts_per_token": 5}, "n_experts_per_token must be between 1"),
        ({"router_aux_loss_coef": -0.1}, "router_aux_loss_coef must be non-negative"),
        ({"norm": "batchnorm"}, "norm 'batchnorm' is not one of layernorm, rmsnorm"),
    ],
)
def test_invalid_configs_get_one_clear_sentence(changes: dict, message: str) -> None:
    with pytest.raises(AttnkitError, match=message) as info:
        ModelConfig(**changes)
    assert "\n" not in str(info.value)


def test_unknown_preset_suggests_the_nearest() -> None:
    with pytest.raises(AttnkitError, match="unknown preset 'paper-bse'; did you mean 'paper-base'"):
        ModelConfig.from_preset("paper-bse")


def test_unknown_field_suggests_the_nearest() -> None:
    with pytest.raises(AttnkitError, match="no field 'n_head'; did you mean 'n_heads'"):
        ModelConfig.from_dict({"n_head": 4})


def test_model_of_the_wrong_shape_is_refused() -> None:
    from attnkit import DecoderOnly

    with pytest.raises(AttnkitError, match="DecoderOnly needs a decoder config"):
        DecoderOnly(ModelConfig.from_preset("tiny"))
    assert type(build_model(ModelConfig.from_preset("gpt-tiny"))).__name__ == "DecoderOnly"


@pytest.mark.parametrize("name", ["dropout", "norm_eps", "rope_theta", "router_aux_loss_coef"])
def test_float_fields_must_be_finite_numbers(name: str) -> None:
    positional = {"positional": "rope"} if name == "rope_theta" else {}
    with pytest.raises(AttnkitError, match=rf"^{name} must be a finite number, got nan$"):
        ModelConfig(**positional, **{name: float("nan")})
