"""Bad input to a model stops with one sentence that says what to do, not a deep traceback."""

import pytest
import torch

from attnkit import AttnkitError, ModelConfig, build_model


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
