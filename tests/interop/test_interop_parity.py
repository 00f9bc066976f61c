"""GPT-2, BERT and Marian imported from transformers give its outputs; exports load back."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from attnkit import ModelConfig, build_model
from attnkit.interop import load_hf, save_hf
from bench.peers.hf_models import CASES, parity_batch, run_attnkit, run_hf, save_random


@pytest.fixture(scope="module", params=list(CASES))
def saved(request, tmp_path_factory):
    """(case, folder of a random transformers model, that model reloaded)."""
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, save_random(request.param, path)


def assert_real_positions_close(ours, theirs, mask, atol=1e-5):
    torch.testing.assert_close(ours[mask], theirs[mask], atol=atol, rtol=0)


def tolerance(case: str, theirs: torch.Tensor) -> float:
    """1e-5; for T5, 1e-5 of the largest logit: its lm_head starts at std 1 (not 0.02), so
    logits reach about 20 and float32 rounding alone (torch's RMSNorm against T5's own,
    exact in float64) moves them by a few 1e-5."""
    return 1e-5 * max(1.0, theirs.abs().max().item()) if case.startswith("t5") else 1e-5


def test_import_gives_the_outputs_of_transformers_on_a_padded_batch(saved):
    case, path, hf = saved
    model = load_hf(path).model
    assert not model.training
    batch = parity_batch(model)
    ours, mask = run_attnkit(model, batch)
    theirs = run_hf(hf, batch)
    assert_real_positions_close(ours, theirs, mask, tolerance(case, theirs))


def test_export_then_import_round_trips_exactly(saved, tmp_path):
    _, path, _ = saved
    model = load_hf(path).model
    out = save_hf(model, tmp_path / "out")
    again = load_hf(out).model
    assert again.config == model.config
    theirs = again.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name
    # The exported files hold the source's own tensors under the source's names.
    source, exported = load_file(path / "model.safetensors"), load_file(out / "model.safetensors")
    for name, tensor in exported.items():
        assert torch.equal(tensor, source[name]), name


def test_exported_model_loads_in_transformers_with_the_same_outputs(saved, tmp_path):
    case, path, hf = saved
    model = load_hf(path).model
    out = save_hf(model, tmp_path / "out")
    reloaded = CASES[case][0].from_pretrained(out, attn_implementation="eager").eval()
    batch = parity_batch(model, seed=1)
    ours, mask = run_attnkit(model, batch)
    theirs = run_hf(reloaded, batch)
    assert_real_positions_close(theirs, run_hf(hf, batch), mask, atol=0)
    assert_real_positions_close(ours, theirs, mask, tolerance(case, theirs))


@pytest.mark.parametrize("case", ["gpt2", "llama", "mistral", "mixtral", "bloom"])
def test_left_padding_matches_transformers_given_the_same_positions(case, tmp_path):
    hf = save_random(case, tmp_path)
    model = load_hf(tmp_path).model
    ids = torch.randint(0, 60, (2, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ours = model(ids, mask).logits
        theirs = hf(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits
    assert_real_positions_close(ours, theirs, mask)


@pytest.mark.parametrize(
    ("preset", "changes", "hf_class"),
    [
        ("gpt-tiny", {}, "GPT2LMHeadModel"),
        ("llama-tiny", {}, "LlamaForCausalLM"),
        ("llama-tiny", {"rope_scaling": 4.0, "rope_scaling_type": "linear"}, "LlamaForCausalLM"),
        ("llama-tiny", {"attention_window": 4}, "MistralForCausalLM"),
        ("llama-tiny", {"n_experts": 4, "n_experts_per_token": 2}, "MixtralForCausalLM"),
        ("bert-mini", {"n_token_types": 2, "embedding_norm": True}, "BertModel"),
    ],
)
def test_a_model_built_in_attnkit_exports_to_transformers(preset, changes, hf_class, tmp_path):
    import transformers

    sizes = {"vocab_size": 61, "d_model": 32, "d_ff": 64, "max_len": 32}
    model = build_model(ModelConfig.from_preset(preset, **sizes, **changes)).eval()
    theirs = getattr(transformers, hf_class).from_pretrained(save_hf(model, tmp_path)).eval()
    batch = parity_batch(model)
    ours, mask = run_attnkit(model, batch)
    assert_real_positions_close(ours, run_hf(theirs, batch), mask)
