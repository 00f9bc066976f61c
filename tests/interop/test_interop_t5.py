"""T5 (v1.1 / Flan-T5 shaped) imported from transformers decodes as transformers' `generate`:
the relative bias follows the KV cache step by step; the original T5's scaling is refused; a
model tied to all its embeddings exports as T5 v1.1 with a copied lm_head."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import T5ForConditionalGeneration

from attnkit import AttnkitError, build_model
from attnkit.cli import main
from attnkit.data.batch import pad
from attnkit.generation import generate
from attnkit.interop import load_hf, save_hf
from attnkit.run import save_pretrained
from bench.peers.hf_models import (
    parity_batch,
    random_model,
    randomize,
    run_attnkit,
    run_hf,
    save_random,
    t5_config,
)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    path = tmp_path_factory.mktemp("t5")
    hf = save_random("t5", path, seed=4, scale=0.1)
    # EOS takes the output row of the token that the second source's greedy decoding writes
    # fourth, a little larger: that row ends early, the others run past distance 12 (the
    # log-spaced buckets), so lengths differ and the length penalty counts.
    ids, mask = sources()
    with torch.no_grad():
        first = hf.generate(input_ids=ids, attention_mask=mask.long(), max_new_tokens=5)
        token = first[1, 4].item()
        hf.lm_head.weight[hf.config.eos_token_id] = 1.01 * hf.lm_head.weight[token]
    hf.save_pretrained(path)
    return load_hf(path).model, hf


def sources():
    generator = torch.Generator().manual_seed(6)
    lengths = (9, 3, 6)
    return pad([torch.randint(2, 61, (n,), generator=generator).tolist() for n in lengths], 0)


OPTIONS = {
    "greedy": {"num_beams": 1, "max_new_tokens": 14},
    "beam-3": {"num_beams": 3, "max_new_tokens": 14, "length_penalty": 0.8},
}


@pytest.mark.parametrize("case", OPTIONS)
def test_generate_matches_transformers(twins, case):
    model, hf = twins
    assert model.config.tie_embeddings == "inputs"  # Flan-T5's own lm_head
    ids, mask = sources()
    ids_of = {"decoder_start_token_id": 0, "eos_token_id": 1, "pad_token_id": 0}
    ours = generate(model, ids, mask, **ids_of, **OPTIONS[case])
    with torch.no_grad():
        theirs = hf.generate(
            input_ids=ids, attention_mask=mask.long(), do_sample=False, **ids_of, **OPTIONS[case]
        )
    assert ours.sequences.tolist() == theirs.tolist()
    # Guards the comparison: some rows end before others, and some run past distance 12.
    lengths = [len(tokens) for tokens in ours.new_tokens()]
    assert len(set(lengths)) > 1 and max(lengths) > 12


def test_a_t5_saved_by_transformers_5_without_lm_head_reads_shared_for_it(tmp_path):
    # transformers 5 ties a T5's head to `shared` when it builds one and saves no lm_head.
    hf = random_model(T5ForConditionalGeneration, t5_config(), seed=2, scale=0.1).eval()
    hf.save_pretrained(tmp_path)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")
    model = load_hf(tmp_path).model
    assert torch.equal(model.head.weight, hf.shared.weight)
    batch = parity_batch(model)
    ours, mask = run_attnkit(model, batch)
    theirs = run_hf(hf, batch)
    scale = theirs.abs().max().item()
    torch.testing.assert_close(ours[mask], theirs[mask], atol=1e-5 * scale, rtol=0)


def test_the_original_t5_is_refused_in_one_sentence(tmp_path):
    save_random("t5-relu", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["tie_word_embeddings"] = True  # the original T5: tied and scaled
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(AttnkitError, match="original T5"):
        load_hf(tmp_path)


def test_in_float64_the_outputs_agree_to_rounding(tmp_path, monkeypatch):
    """In float32 the logits (about 20 in size) differ by a few 1e-5, the kernels' rounding;
    in float64 the two agree to 1e-10, which no mapping error would allow. T5's own norm
    computes its variance in float32 whatever the input, so here it keeps the input's type."""
    from transformers.models.t5 import modeling_t5

    def norm(self, x):
        return self.weight * (
            x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        )

    monkeypatch.setattr(modeling_t5.T5LayerNorm, "forward", norm)
    hf = save_random("t5", tmp_path).double()
    model = load_hf(tmp_path).model.double()
    batch = parity_batch(model)
    ours, mask = run_attnkit(model, batch)
    torch.testing.assert_close(ours[mask], run_hf(hf, batch)[mask], atol=1e-10, rtol=0)


@pytest.fixture(scope="module")
def tied_to_all(tmp_path_factory):
    """An attnkit model of Flan-T5's shape (the "t5" case's config) whose output layer is its
    one embedding matrix (`tie_embeddings = "all"`), with random weights."""
    path = tmp_path_factory.mktemp("t5-config")
    save_random("t5", path)
    config = dataclasses.replace(load_hf(path).model.config, tie_embeddings="all")
    torch.manual_seed(5)
    model = randomize(build_model(config), seed=5, scale=0.1).eval()
    assert model.head.weight is model.src_embed.token.weight
    return model


def test_a_model_tied_to_all_embeddings_exports_as_t5_with_a_copied_head(tied_to_all, tmp_path):
    model = tied_to_all
    out = save_hf(model, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    weights = load_file(out / "model.safetensors")
    assert torch.equal(weights["lm_head.weight"], weights["shared.weight"])
    hf = T5ForConditionalGeneration.from_pretrained(out, attn_implementation="eager").eval()
    # transformers 5 ties the equal matrices again, but reads the head unscaled (not v1.0).
    assert hf.config.scale_decoder_outputs is False
    batch = parity_batch(model)
    ours, mask = run_attnkit(model, batch)
    theirs = run_hf(hf, batch)
    scale = theirs.abs().max().item()
    torch.testing.assert_close(ours[mask], theirs[mask], atol=1e-5 * scale, rtol=0)
    # Imported back: the head is a matrix of its own, and the function is the same.
    again = load_hf(out).model
    assert again.config == dataclasses.replace(model.config, tie_embeddings="inputs")
    assert torch.equal(again.head.weight, model.head.weight)
    torch.testing.assert_close(run_attnkit(again, batch)[0], ours, atol=0, rtol=0)


def test_the_cli_exports_a_run_tied_to_all_embeddings_as_t5(tied_to_all, tmp_path, capsys):
    save_pretrained(tied_to_all, tmp_path / "run")
    assert main(["export", "hf", str(tmp_path / "run"), str(tmp_path / "out")]) == 0
    assert "exported" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "t5"
    batch = parity_batch(tied_to_all, seed=1)
    ours, mask = run_attnkit(tied_to_all, batch)
    theirs, _ = run_attnkit(load_hf(tmp_path / "out").model, batch)
    torch.testing.assert_close(theirs[mask], ours[mask], atol=0, rtol=0)
