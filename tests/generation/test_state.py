"""The decoding state: padding stays out of the results, and bad inputs stop before decoding."""

import pytest
import torch

from attnkit import AttnkitError, ModelConfig, build_model
from attnkit.generation import generate, stream
from tests.helpers import DECODING, peaked, source_batch, tiny_model


@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("shape", ["encoder-decoder", "decoder"])
def test_padding_never_leaks_into_results(shape, num_beams):
    """Each input decoded alone equals it decoded in a padded batch (left or right padding)."""
    model = peaked(shape)
    ids, mask = source_batch()
    batched = generate(model, ids, mask, max_new_tokens=8, num_beams=num_beams).new_tokens()
    for row in range(ids.shape[0]):
        alone = ids[row : row + 1, : int(mask[row].sum())]
        assert generate(model, alone, max_new_tokens=8, num_beams=num_beams).new_tokens() == [
            batched[row]
        ]


def test_bad_inputs_are_refused_clearly():
    with pytest.raises(AttnkitError, match="cannot generate"):
        encoder = build_model(
            ModelConfig.from_preset("bert-mini", vocab_size=40, n_encoder_layers=1)
        )
        generate(encoder, torch.ones(1, 2, dtype=torch.long))
    ids, mask = torch.ones(2, 3, dtype=torch.long), torch.tensor([[1, 1, 1], [0, 0, 0]])
    with pytest.raises(AttnkitError, match="row 1 is all padding"):
        generate(tiny_model("encoder-decoder", **DECODING, decoder_start_id=1), ids, mask)
    decoder = tiny_model("decoder", **DECODING)
    with pytest.raises(AttnkitError, match="no room under this model's max_len"):
        generate(decoder, torch.ones(1, 48, dtype=torch.long))
    with pytest.raises(AttnkitError, match="cannot stream"):
        next(stream(decoder, torch.ones(1, 2, dtype=torch.long), num_beams=2))
