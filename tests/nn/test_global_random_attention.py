"""Longformer's global tokens and BigBird's random blocks: the pattern, and models that use it."""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import AttnkitError
from attnkit.nn.window import Window
from tests.helpers import padded_batch, tiny_config, tiny_model

SPARSE = {"attention_window": 3, "dropout": 0.0, "embedding_dropout": 0.0}


def test_global_positions_see_and_are_seen_by_every_position():
    extra = Window(3, global_tokens=2).extra_keys(10, 0, 32, torch.device("cpu"))
    assert extra[:2].all() and extra[:, :2].all()
    assert not extra[2:, 2:].any()  # no random blocks: nothing else


def test_random_blocks_are_whole_blocks_fixed_per_layer_and_differ_between_layers():
    window, cpu = Window(4, random_blocks=2), torch.device("cpu")
    first = window.extra_keys(24, 0, 24, cpu)
    assert torch.equal(first, window.extra_keys(24, 0, 24, cpu))  # fixed
    assert not torch.equal(first, window.extra_keys(24, 1, 24, cpu))
    blocks = first.view(6, 4, 6, 4)
    # Each (query block, key block) pair is all in or all out; two key blocks per query block.
    assert torch.equal(blocks.all(dim=(1, 3)), blocks.any(dim=(1, 3)))
    assert (blocks.all(dim=(1, 3)).sum(1) == 2).all()
    # A shorter sequence keeps the draw: its keys are the first ones of the longer's.
    assert torch.equal(window.extra_keys(10, 0, 24, cpu), first[:10, :10])


def test_a_model_attends_exactly_through_its_window_global_and_random_keys():
    """The encoder's output at a position moves when a key it sees changes, not otherwise."""
    model = tiny_model("encoder", layers=1, **SPARSE, attention_global=1, attention_random=1)
    model.eval()
    ids = torch.randint(5, 24, (1, 15))  # VOCAB is 24
    window = model.encoder.window
    seen = window.extra_keys(15, 0, model.config.max_len, torch.device("cpu"))
    distance = (torch.arange(15)[:, None] - torch.arange(15)[None]).abs()
    seen |= distance < 3
    with torch.no_grad():
        base = model(ids).logits
        for key in range(15):
            changed = ids.clone()
            changed[0, key] = 5 + (changed[0, key] - 4) % 19
            moved = (model(changed).logits - base).abs().amax(-1)[0] > 1e-6
            assert torch.equal(moved, seen[:, key]), key


def test_padding_stays_invisible_and_a_batch_equals_its_rows_alone():
    model = tiny_model("encoder", layers=2, **SPARSE, attention_global=2, attention_random=1)
    model.eval()
    ids, mask = padded_batch([9, 5], 9, vocab_size=24)
    with torch.no_grad():
        together = model(ids, mask).logits
        alone = model(ids[1:, :5], mask[1:, :5]).logits
    torch.testing.assert_close(together[1, :5], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "changes",
    [
        {"attention_global": 1},  # no window
        {"attention_random": 1, "attention_window": 4, "positional": "alibi"},
    ],
)
def test_settings_that_cannot_work_are_refused(changes):
    with pytest.raises(AttnkitError, match="attention_global and attention_random"):
        tiny_config("encoder", **changes)


def test_a_decoder_only_model_is_refused_and_an_encoder_decoder_keeps_a_plain_decoder():
    with pytest.raises(AttnkitError, match="shape with an encoder"):
        tiny_config("decoder", attention_window=3, attention_global=1)
    model = tiny_model("encoder-decoder", **SPARSE, attention_global=1, attention_random=1)
    assert model.encoder.window.global_tokens == 1
    assert model.decoder.window.global_tokens == 0 and model.decoder.window.random_blocks == 0


def test_a_trained_draw_keeps_its_max_len(tmp_path):
    from attnkit.run import load_pretrained, save_pretrained

    save_pretrained(tiny_model("encoder", **SPARSE, attention_random=1), tmp_path)
    with pytest.raises(AttnkitError, match="draws its random attention blocks"):
        load_pretrained(tmp_path, overrides={"max_len": 64})
