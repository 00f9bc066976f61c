"""Reading Hugging Face folders: file formats, name prefixes, tied copies, and bad input."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load_file
from transformers import BertForMaskedLM, MarianMTModel
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

from attnkit import AttnkitError, ModelConfig, build_model, from_pretrained
from attnkit.cli import main
from attnkit.interop import load_hf, save_hf
from attnkit.nn import sinusoidal_table
from attnkit.run import save_pretrained
from bench.peers.hf_models import (
    CASES,
    marian_config,
    parity_batch,
    randomize,
    run_attnkit,
    run_hf,
    save_random,
)
from tests.helpers import rewrite_weights


@pytest.fixture
def random_gpt2(tmp_path):
    """A Hugging Face folder of a random GPT-2 (`save_random`)."""
    save_random("gpt2", tmp_path)
    return tmp_path


def test_an_unsupported_model_type_lists_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bart"}))
    supported = r"gpt2, llama, mistral, mixtral, bloom, bert, marian, t5"
    with pytest.raises(AttnkitError, match=rf"'bart' is not supported; .*{supported}"):
        load_hf(tmp_path)


def test_a_missing_tensor_is_named_with_its_expected_shape(random_gpt2):
    rewrite_weights(random_gpt2, lambda t: t.pop("transformer.h.1.mlp.c_fc.weight"))
    with pytest.raises(AttnkitError, match=r"'transformer.h.1.mlp.c_fc.weight' \(expected shape"):
        load_hf(random_gpt2)


def test_a_misshaped_tensor_is_named_with_both_shapes(random_gpt2):
    def shrink(tensors):
        tensors["transformer.h.0.attn.c_attn.weight"] = torch.zeros(32, 95)

    rewrite_weights(random_gpt2, shrink)
    with pytest.raises(
        AttnkitError,
        match=r"'transformer.h.0.attn.c_attn.weight' .* shape \(32, 95\) .* needs \(32, 96\)",
    ):
        load_hf(random_gpt2)


def test_unused_tensors_are_reported_not_dropped(random_gpt2, caplog):
    rewrite_weights(random_gpt2, lambda t: t.update({"transformer.extra.weight": torch.ones(3)}))
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        imported = load_hf(random_gpt2)
    assert imported.unused == ["transformer.extra.weight"]
    assert "transformer.extra.weight" in caplog.text


def test_pytorch_model_bin_reads_like_safetensors(random_gpt2, tmp_path):
    expected = load_hf(random_gpt2).model.state_dict()
    torch.save(load_file(random_gpt2 / "model.safetensors"), random_gpt2 / "pytorch_model.bin")
    (random_gpt2 / "model.safetensors").unlink()
    got = load_hf(random_gpt2).model.state_dict()
    assert all(torch.equal(got[name], tensor) for name, tensor in expected.items())


def test_a_bert_with_a_masked_lm_head_imports_its_encoder(tmp_path):
    hf = randomize(BertForMaskedLM(CASES["bert"][1]()), seed=2).eval()
    hf.save_pretrained(tmp_path)
    imported = load_hf(tmp_path)
    assert all(name.startswith("cls.") for name in imported.unused) and imported.unused
    batch = parity_batch(imported.model)
    ours, mask = run_attnkit(imported.model, batch)
    torch.testing.assert_close(ours[mask], run_hf(hf.bert, batch)[mask], atol=1e-5, rtol=0)


def test_tensorflow_names_of_norms_are_read(tmp_path):
    hf = save_random("bert", tmp_path)

    def rename(tensors):
        for name in [n for n in tensors if "LayerNorm" in n]:
            suffix = {"weight": "gamma", "bias": "beta"}[name.rsplit(".", 1)[1]]
            tensors[f"bert.{name.rsplit('.', 1)[0]}.{suffix}"] = tensors.pop(name)

    rewrite_weights(tmp_path, rename)
    model = load_hf(tmp_path).model
    batch = parity_batch(model)
    ours, mask = run_attnkit(model, batch)
    torch.testing.assert_close(ours[mask], run_hf(hf, batch)[mask], atol=1e-5, rtol=0)


def test_older_marian_files_with_stored_tables_and_tied_copies_import(tmp_path):
    save_random("marian", tmp_path)
    table = MarianSinusoidalPositionalEmbedding(32, 32)
    table.weight.data = table.create_weight()

    def add_old_names(tensors):
        for side in ("encoder", "decoder"):
            tensors[f"model.{side}.embed_positions.weight"] = table.weight.detach().clone()
            tensors[f"model.{side}.embed_tokens.weight"] = tensors["model.shared.weight"].clone()
        tensors["lm_head.weight"] = tensors["model.shared.weight"].clone()

    rewrite_weights(tmp_path, add_old_names)
    assert load_hf(tmp_path).unused == []


def test_a_stored_table_of_the_wrong_layout_is_refused(tmp_path):
    save_random("marian", tmp_path)
    interleaved = sinusoidal_table(32, 32, "interleaved")
    rewrite_weights(
        tmp_path, lambda t: t.update({"model.encoder.embed_positions.weight": interleaved})
    )
    with pytest.raises(AttnkitError, match="does not match the table"):
        load_hf(tmp_path)


def test_tied_copies_that_differ_are_refused(tmp_path):
    save_random("marian", tmp_path)
    rewrite_weights(tmp_path, lambda t: t.update({"lm_head.weight": t["model.shared.weight"] + 1}))
    with pytest.raises(AttnkitError, match="tied tensor but their values differ"):
        load_hf(tmp_path)


def test_a_model_the_family_cannot_express_is_refused_naming_the_fields(tmp_path):
    model = build_model(ModelConfig.from_preset("tiny"))
    with pytest.raises(AttnkitError, match=r"cannot be written as marian: .*sinusoidal_layout"):
        save_hf(model, tmp_path)


def test_ntk_scaled_rope_has_no_place_in_llama(tmp_path):
    model = build_model(ModelConfig.from_preset("llama-tiny", rope_scaling=4.0))
    with pytest.raises(AttnkitError, match=r"cannot be written as llama: rope_scaling is 4.0"):
        save_hf(model, tmp_path)


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "yarn", "factor": 4.0},
        {"rope_type": "dynamic", "factor": 4.0},
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 4.0},
    ],
)
def test_rope_scalings_attnkit_does_not_compute_are_refused(rope):
    from attnkit.interop.llama import config_from_hf

    with pytest.raises(AttnkitError, match=f"RoPE scaling of type '{rope['rope_type']}'") as info:
        config_from_hf({"rope_parameters": {"rope_theta": 500.0, **rope}})
    assert "\n" not in str(info.value)


def test_from_pretrained_reads_both_folder_kinds(random_gpt2, tmp_path):
    from_hf = from_pretrained(random_gpt2)
    from_run = from_pretrained(save_pretrained(from_hf, tmp_path / "run"))
    assert from_run.config == from_hf.config
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(from_run(ids).logits, from_hf(ids).logits)


def test_cli_imports_and_exports(tmp_path, capsys):
    save_random("bert", tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").write_text("{}")
    assert main(["import", "hf", str(tmp_path / "hf"), str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "imported bert" in out and "pooler.dense.weight" in out
    assert (tmp_path / "run" / "tokenizer.json").read_text() == "{}"
    assert main(["export", "hf", str(tmp_path / "run"), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "tokenizer.json").is_file()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "bert"


def test_cli_states_bad_input_in_one_sentence(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bart"}))
    assert main(["import", "hf", str(tmp_path), str(tmp_path / "run")]) == 2
    assert "model_type 'bart' is not supported" in capsys.readouterr().err


def test_marian_config_of_unequal_stacks_is_refused(tmp_path):
    MarianMTModel(marian_config(decoder_ffn_dim=128)).save_pretrained(tmp_path)
    with pytest.raises(AttnkitError, match="decoder_ffn_dim=128; attnkit uses one d_ff"):
        load_hf(tmp_path)
