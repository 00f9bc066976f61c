"""Greedy and sampled decoding: seeds, top-k 1, streaming, and decoding past max_len."""

import pytest
import torch

from attnkit.generation import generate, stream
from tests.helpers import peaked, source_batch


@pytest.mark.parametrize("shape", ["encoder-decoder", "decoder"])
def test_top_k_one_sampling_is_greedy(shape):
    model = peaked(shape)
    ids, mask = source_batch()
    greedy = generate(model, ids, mask, max_new_tokens=8)
    sampled = generate(model, ids, mask, max_new_tokens=8, do_sample=True, top_k=1, seed=5)
    assert torch.equal(sampled.sequences, greedy.sequences)


def test_same_seed_same_samples_and_other_seed_other_samples():
    model = peaked("decoder", scale=1.0)
    ids, mask = source_batch()
    options = {"max_new_tokens": 12, "do_sample": True, "temperature": 1.5, "top_p": 0.95}
    a = generate(model, ids, mask, seed=3, **options).sequences
    b = generate(model, ids, mask, seed=3, **options).sequences
    c = generate(model, ids, mask, seed=4, **options).sequences
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_stream_yields_the_greedy_tokens_one_step_at_a_time():
    model = peaked("decoder")
    ids, mask = source_batch()
    steps = list(stream(model, ids, mask, max_new_tokens=6))
    greedy = generate(model, ids, mask, max_new_tokens=6)
    assert torch.equal(torch.stack(steps, 1), greedy.sequences[:, greedy.prefix_length :])


@pytest.mark.parametrize("use_cache", [True, False])
@torch.no_grad()
def test_decoding_past_max_len_conditions_on_the_last_max_len_tokens(use_cache):
    model = peaked("decoder")  # max_len 32
    ids, mask = source_batch()
    out = generate(model, ids, mask, max_new_tokens=40, eos_token_id=(), use_cache=use_cache)
    assert out.sequences.shape[1] == 7 + 40
    for row, n in enumerate(mask.sum(1).tolist()):
        # nanoGPT's loop: crop to the last max_len tokens, run them all, take the argmax.
        seq = ids[row : row + 1, :n]
        for _ in range(40):
            logits = model(seq[:, -32:]).logits[:, -1]
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], 1)
        assert out.sequences[row, -40:].tolist() == seq[0, n:].tolist()
    stopped = generate(model, ids, mask, max_new_tokens=40, crop_context=False)
    assert stopped.sequences.shape[1] <= 32
