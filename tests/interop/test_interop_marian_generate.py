"""Marian imported from transformers decodes token for token as transformers' `generate`.

A batch of sources of different lengths, greedy and beam search (num_beams=4)
with the same length penalty and maximum length, on random weights. The
logits bias leans towards EOS (by an amount found by trying) so that
sequences end at different steps and the length penalty matters.
"""

from __future__ import annotations

import pytest
import torch

from attnkit.data.batch import pad
from attnkit.generation import generate
from attnkit.interop import load_hf
from bench.peers.hf_models import save_random


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    path = tmp_path_factory.mktemp("marian")
    hf = save_random("marian", path, seed=3, scale=0.1, scale_embedding=False)
    with torch.no_grad():
        hf.final_logits_bias[0, hf.config.eos_token_id] += 1.0
    hf.save_pretrained(path)
    return load_hf(path).model, hf


def sources(model):
    """Four right-padded sources of 7, 2, 5 and 4 tokens."""
    generator = torch.Generator().manual_seed(5)
    lengths = (7, 2, 5, 4)
    return pad([torch.randint(1, 50, (n,), generator=generator).tolist() for n in lengths], 50)


def special_ids(model):
    c = model.config
    return {
        "decoder_start_token_id": c.decoder_start_id,
        "eos_token_id": c.eos_id,
        "pad_token_id": c.pad_id,
        "forced_eos_token_id": None,
    }


OPTIONS = {
    "greedy": {"num_beams": 1, "max_new_tokens": 12},
    "beam-4": {"num_beams": 4, "max_new_tokens": 12, "length_penalty": 0.6},
    "beam-4-long": {"num_beams": 4, "max_new_tokens": 12, "length_penalty": 2.0},
    "beam-4-return-2": {
        "num_beams": 4,
        "max_new_tokens": 9,
        "length_penalty": 1.3,
        "num_return_sequences": 2,
    },
}


@pytest.mark.parametrize("case", OPTIONS)
def test_generate_matches_transformers(twins, case):
    model, hf = twins
    ids, mask = sources(model)
    ours = generate(model, ids, mask, **special_ids(model), **OPTIONS[case])
    with torch.no_grad():
        theirs = hf.generate(
            input_ids=ids,
            attention_mask=mask.long(),
            do_sample=False,
            **special_ids(model),
            **OPTIONS[case],
        )
    assert ours.sequences.tolist() == theirs.tolist()
    # Guards the comparison: with no early EOS, the length penalty would go untested.
    assert len({len(tokens) for tokens in ours.new_tokens()}) > 1
