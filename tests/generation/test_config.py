"""Decoding options: checks that speak one sentence, reuse with overrides, the special ids."""

import pytest
import torch

from attnkit import AttnkitError
from attnkit.generation import GenerationConfig, generate
from tests.helpers import DECODING, peaked, source_batch, tiny_model


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"top_p": 0.0}, "top_p must be in"),
        ({"top_p": 1.5}, "top_p must be in"),
        ({"temperature": 0}, "temperature must be positive"),
        ({"num_beams": 2, "num_return_sequences": 3}, "num_return_sequences 3 needs"),
        ({"num_beams": 2, "do_sample": True}, "do not combine"),
        ({"early_stopping": "sometimes"}, "early_stopping must be"),
        ({"min_new_tokens": 30, "max_new_tokens": 5}, "min_new_tokens must be"),
        ({"beams": 3}, "no option 'beams'; did you mean 'num_beams'"),
        ({"xyz": 3}, "no option 'xyz'; see GenerationConfig"),
        ({"logit_bias": {"5": 1.0}}, "logit_bias must map token ids"),
        ({"logit_bias": {5: float("inf")}}, "must be finite"),
        ({"logprobs": -1}, "logprobs must be a non-negative integer"),
        ({"stop_strings": [3]}, "stop_strings must be strings"),
        ({"stop_strings": ("x",)}, "generate returns ids"),
    ],
)
def test_invalid_options_are_one_clear_sentence(options, message):
    model = tiny_model("decoder", **DECODING)
    with pytest.raises(AttnkitError, match=message):
        generate(model, torch.ones(1, 2, dtype=torch.long), **options)


def test_generation_config_can_be_reused_with_overrides():
    model = peaked("decoder")
    ids, mask = source_batch()
    config = GenerationConfig(max_new_tokens=5, num_beams=2)
    a = generate(model, ids, mask, config)
    b = generate(model, ids, mask, config, num_beams=1)
    assert a.sequences_scores is not None and b.sequences_scores is None


@pytest.mark.parametrize("num_beams", [1, 3])
def test_special_ids_default_to_the_model_s(num_beams):
    """The model's eos_id and decoder_start_id decode as the same ids given explicitly."""
    model = peaked("encoder-decoder")
    ids, mask = source_batch()
    given = {"eos_token_id": 2, "decoder_start_token_id": 1, "pad_token_id": 0}
    implicit = generate(model, ids, mask, max_new_tokens=10, num_beams=num_beams)
    explicit = generate(model, ids, mask, max_new_tokens=10, num_beams=num_beams, **given)
    assert torch.equal(implicit.sequences, explicit.sequences)
    assert implicit.eos_token_ids == (2,) and (implicit.sequences[:, 0] == 1).all()


def test_no_eos_decodes_to_max_new_tokens():
    """eos_token_id=() and a model without eos_id both run every row to max_new_tokens."""
    model = peaked("decoder")
    ids, mask = source_batch()
    assert min(len(t) for t in generate(model, ids, mask, max_new_tokens=10).new_tokens()) < 10
    off = generate(model, ids, mask, max_new_tokens=10, eos_token_id=())
    assert off.eos_token_ids == () and off.sequences.shape[1] == 7 + 10
    bare = tiny_model("decoder", **DECODING)
    assert bare.config.eos_id is None
    assert generate(bare, ids, mask, max_new_tokens=10).sequences.shape[1] == 7 + 10


def test_an_encoder_decoder_without_a_start_id_asks_for_one():
    model = tiny_model("encoder-decoder", **DECODING)
    ids, mask = source_batch()
    with pytest.raises(AttnkitError, match="no decoder_start_id; pass decoder_start_token_id"):
        generate(model, ids, mask)
    out = generate(model, ids, mask, max_new_tokens=3, decoder_start_token_id=1)
    assert (out.sequences[:, 0] == 1).all()


def test_row_options_are_stored_hashable_and_the_tokenizer_gives_the_special_ids(tmp_path):
    """A config is a key of batched work (hashable); `resolve` with a tokenizer takes its ids,
    and ids given stay as given."""
    from attnkit.generation.config import resolve
    from attnkit.run import load_run
    from tests.helpers import tiny_run

    config = GenerationConfig(logit_bias={7: 1.0, 3: -2}, stop_strings="end")
    assert config.logit_bias == ((7, 1.0), (3, -2.0)) and config.stop_strings == ("end",)
    assert hash(config) == hash(GenerationConfig(logit_bias=[(7, 1.0), (3, -2.0)],
                                                 stop_strings=("end",)))  # fmt: skip
    run = load_run(tiny_run(tmp_path / "ed", "encoder-decoder"))
    tokenizer = run.tokenizer
    resolved = resolve(None, {}, run.model.config, tokenizer)
    assert (resolved.eos_token_id, resolved.pad_token_id, resolved.decoder_start_token_id) == (
        tokenizer.eos_id, tokenizer.pad_id, tokenizer.bos_id)  # fmt: skip
    assert resolve(None, {"eos_token_id": ()}, run.model.config, tokenizer).eos_ids == ()
