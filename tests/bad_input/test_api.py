"""Bad input to the Python API (models, decoding options) stops with one sentence that says
what to do, not a deep traceback and never a silently wrong result."""

import logging
import math

import pytest
import torch

from attnkit import AttnkitError, ModelConfig, build_model
from attnkit.generation import GenerationConfig, beam_search, generate


@pytest.fixture(scope="module")
def models():
    return {
        name: build_model(ModelConfig.from_preset(name, max_len=16)).eval()
        for name in ("tiny", "gpt-tiny")
    }


def run(model, ids, mask=None):
    if model.config.shape == "encoder-decoder":
        return model(ids, ids, mask, mask)
    return model(ids, mask)


@pytest.mark.parametrize("name", ["tiny", "gpt-tiny"])
def test_token_ids_outside_the_vocabulary(models, name: str) -> None:
    model = models[name]
    vocab = model.config.vocab_size
    with pytest.raises(
        AttnkitError, match=f"token id {vocab} is outside the vocabulary of {vocab}"
    ):
        run(model, torch.tensor([[1, 2, vocab]]))
    with pytest.raises(AttnkitError, match="token id -1 is outside the vocabulary"):
        run(model, torch.tensor([[1, -1]]))


@pytest.mark.parametrize("name", ["tiny", "gpt-tiny"])
def test_sequences_longer_than_max_len(models, name: str) -> None:
    with pytest.raises(AttnkitError, match="has length 17, over max_len 16 of this model"):
        run(models[name], torch.ones(1, 17, dtype=torch.long))


@pytest.mark.parametrize("name", ["tiny", "gpt-tiny"])
def test_masks_of_the_wrong_shape(models, name: str) -> None:
    ids = torch.ones(2, 5, dtype=torch.long)
    with pytest.raises(AttnkitError, match=r"padding mask of \w+ has shape \(2, 4\) but"):
        run(models[name], ids, torch.ones(2, 4, dtype=torch.bool))


def test_ids_of_the_wrong_rank_or_type(models) -> None:
    with pytest.raises(AttnkitError, match=r"must be a \(batch, length\) tensor"):
        models["gpt-tiny"](torch.ones(5, dtype=torch.long))
    with pytest.raises(AttnkitError, match="must be an integer tensor"):
        models["gpt-tiny"](torch.ones(1, 5))


def test_integer_masks_are_accepted_as_hugging_face_passes_them(models) -> None:
    model = models["gpt-tiny"]
    ids = torch.tensor([[5, 6, 7, 0]])
    with torch.no_grad():
        from_int = model(ids, torch.tensor([[1, 1, 1, 0]])).logits
        from_bool = model(ids, torch.tensor([[True, True, True, False]])).logits
    torch.testing.assert_close(from_int, from_bool)


def additive(mask: torch.Tensor) -> torch.Tensor:
    """torch's additive form of a True-for-real-token mask: 0 for real tokens, -inf for padding."""
    return torch.zeros(mask.shape).masked_fill(~mask, -math.inf)


@pytest.mark.parametrize("name", ["tiny", "gpt-tiny"])
def test_a_float_additive_mask_is_refused_not_read_with_padding_inverted(models, name) -> None:
    ids = torch.tensor([[5, 6, 7, 0]])
    mask = additive(torch.tensor([[True, True, True, False]]))
    with pytest.raises(AttnkitError, match=r"padding mask of \w+ holds floats .*`mask == 0`"):
        run(models[name], ids, mask)
    with pytest.raises(AttnkitError, match="padding mask of input_ids holds floats"):
        generate(
            models[name], ids, mask, max_new_tokens=2, eos_token_id=(), decoder_start_token_id=1
        )


@pytest.mark.parametrize("name", ["tiny", "gpt-tiny"])
@pytest.mark.parametrize(
    "make",
    [
        lambda real: torch.where(real, 0, -10000),  # additive, as in torch.where(ids == pad, ...)
        lambda real: real.long() * 2,  # 0 / 2
    ],
    ids=["additive -10000/0", "0/2"],
)
def test_an_integer_mask_other_than_0_1_is_refused_not_read_as_nonzero_keeps(
    models, name, make
) -> None:
    """An int64 additive mask read as bool keeps only the padding (issue 39, BAD 4)."""
    ids = torch.tensor([[5, 6, 7, 0]])
    mask = make(torch.tensor([[True, True, True, False]]))
    with pytest.raises(
        AttnkitError,
        match=r"padding mask of \w+ holds torch\.int64 values other than 0 and 1 .*`mask == 0`",
    ):
        run(models[name], ids, mask)
    with pytest.raises(AttnkitError, match=r"padding mask of input_ids holds torch\.int64 values"):
        generate(
            models[name], ids, mask, max_new_tokens=2, eos_token_id=(), decoder_start_token_id=1
        )


def test_a_float_source_mask_given_to_decode_is_refused(models) -> None:
    model = models["tiny"]
    src = torch.tensor([[5, 6, 0]])
    memory = model.encode(src)
    with pytest.raises(AttnkitError, match="padding mask of src_ids holds floats"):
        model.decode(torch.tensor([[1, 5]]), memory, additive(src != 0))


@pytest.mark.parametrize(("sources", "targets"), [(2, 1), (3, 2), (1, 2)])
def test_source_and_target_batches_of_different_sizes_are_refused(models, sources, targets):
    """2 sources with 1 target was broadcast silently; 3 with 2 crashed inside attention."""
    model = models["tiny"]
    src, tgt = torch.ones(sources, 4, dtype=torch.long), torch.ones(targets, 3, dtype=torch.long)
    message = f"tgt_ids is a batch of {targets} but the source a batch of {sources}; give one"
    with pytest.raises(AttnkitError, match=message):
        model(src, tgt)
    with pytest.raises(AttnkitError, match=message):
        model.decode(tgt, model.encode(src))


def test_a_source_mask_that_does_not_cover_the_memory_is_refused(models) -> None:
    model = models["tiny"]
    memory = model.encode(torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(AttnkitError, match=r"src_mask has shape \(1, 4\) but the memory covers"):
        model.decode(torch.ones(2, 3, dtype=torch.long), memory, torch.ones(1, 4, dtype=torch.bool))


@pytest.mark.parametrize("shape", [(0, 4), (2, 0)])
@pytest.mark.parametrize("name", ["tiny", "gpt-tiny"])
def test_an_empty_batch_is_refused(models, name, shape) -> None:
    """No rows, or rows of no tokens: one sentence, not a division by zero inside attention."""
    ids = torch.ones(shape, dtype=torch.long)
    with pytest.raises(AttnkitError, match=rf"is empty \(shape \({shape[0]}, {shape[1]}\)\)"):
        run(models[name], ids)
    for decode, beams in ((generate, 1), (beam_search, 2)):
        with pytest.raises(AttnkitError, match="input_ids must be a non-empty"):
            decode(models[name], ids, max_new_tokens=2, num_beams=beams, decoder_start_token_id=1)


def test_a_fractional_max_new_tokens_is_refused(models) -> None:
    """It failed inside torch.empty; GenerationConfig now takes only positive integers."""
    with pytest.raises(AttnkitError, match=r"max_new_tokens must be a positive integer, got 2\.5"):
        GenerationConfig(max_new_tokens=2.5)
    with pytest.raises(AttnkitError, match=r"max_new_tokens must be a positive integer, got 2\.5"):
        generate(models["gpt-tiny"], torch.ones(1, 2, dtype=torch.long), max_new_tokens=2.5)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("length_penalty", math.nan, "length_penalty must be a finite number, got nan"),
        ("length_penalty", math.inf, "length_penalty must be a finite number, got inf"),
        ("temperature", math.inf, "temperature must be a finite number, got inf"),
        ("repetition_penalty", math.inf, "repetition_penalty must be a finite number"),
        ("min_new_tokens", 1.5, "min_new_tokens must be a non-negative integer"),
        ("num_return_sequences", 1.5, "num_return_sequences must be a positive integer"),
    ],
)
def test_non_finite_or_fractional_decoding_options_are_refused(option, value, message) -> None:
    """length_penalty=nan was accepted (NaN temperature and top_p already were not)."""
    with pytest.raises(AttnkitError, match=message):
        GenerationConfig(**{option: value})


# -- the Python API's arguments are checked for their type (issue 39, POOR) ---------------------


@pytest.mark.parametrize("given", [[[5, 6, 7]], {"input_ids": [5, 6]}, "5 6 7"])
def test_a_list_or_dict_where_a_tensor_belongs_is_named(models, given) -> None:
    kind = type(given).__name__
    model = models["gpt-tiny"]
    with pytest.raises(AttnkitError, match=rf"ids must be a torch\.Tensor, not an? {kind}; make"):
        model(given)
    with pytest.raises(AttnkitError, match=rf"input_ids must be a torch\.Tensor, not an? {kind}"):
        generate(model, given, max_new_tokens=2)
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(AttnkitError, match=r"padding mask of input_ids must be a torch\.Tensor"):
        generate(model, ids, [[1, 1, 1]], max_new_tokens=2)


def test_a_dict_where_a_config_belongs_is_named(models) -> None:
    from attnkit.train.tasks import train

    with pytest.raises(
        AttnkitError, match="config must be a ModelConfig, not a dict; make one with"
    ):
        build_model({"shape": "decoder"})
    with pytest.raises(
        AttnkitError, match="config must be a GenerationConfig, not a dict; give options"
    ):
        generate(models["gpt-tiny"], torch.tensor([[5]]), config={"max_new_tokens": 2})
    with pytest.raises(AttnkitError, match="config must be a RunConfig, not a dict; read one"):
        train({"data": {"task": "language-model"}})


def test_tokenizer_arguments_of_the_wrong_type_or_range_are_named(caplog) -> None:
    from attnkit.tokenizer import Tokenizer

    tokenizer = Tokenizer.train("char", texts=["a dog runs", "the cat sleeps"])
    size = tokenizer.vocab_size
    with pytest.raises(AttnkitError, match="text must be a str, not an int"):
        tokenizer.encode(123)
    with pytest.raises(AttnkitError, match="texts is one string; give a list of strings"):
        tokenizer.encode_batch("a dog")
    with pytest.raises(AttnkitError, match=r"texts\[1\] must be a str, not a NoneType"):
        tokenizer.encode_batch(["a dog", None])
    with pytest.raises(AttnkitError, match=r"ids\[0\] is 'a', not a token id \(an int from 0"):
        tokenizer.decode(["a"])
    with pytest.raises(AttnkitError, match=r"ids\[1\] is -1, not a token id"):
        tokenizer.decode([5, -1])  # overflowed inside the backend
    # One unknown id was dropped without a word: it is still left out (a model may give ids
    # past its tokenizer's), and said.
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        assert tokenizer.decode([5, size]) == tokenizer.decode([5])
        tokenizer.decode_batch(torch.tensor([[size + 1, 5]]))
    assert f"ids {size} are not in this vocabulary of {size} tokens (0 to {size - 1}); left" in (
        caplog.text
    )
    assert f"ids {size + 1} are not in this vocabulary" in caplog.text
    ids = tokenizer.encode("a dog")
    assert tokenizer.decode(torch.tensor(ids)) == tokenizer.decode(ids) == "a dog"
