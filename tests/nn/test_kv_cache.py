"""A cached decode equals an uncached one, step by step, for both decoding shapes."""

import pytest
import torch

from attnkit import AttnkitError
from attnkit.generation import left_pad
from attnkit.kernels import step_attention
from tests.helpers import DECODING, VARIANTS, padded_batch, tiny_model


@pytest.mark.parametrize(
    "overrides",
    [{}, {"n_kv_heads": 2}, {"norm_position": "pre"}, *list(VARIANTS.values())[1:]],
)
@torch.no_grad()
def test_decoder_only_cache_matches_full_forward_with_left_padding(overrides):
    model = tiny_model("decoder", **DECODING, **overrides).eval()
    prompt, mask = left_pad(*padded_batch([6, 3, 1], 6))
    cache = model.new_cache(prompt, mask, capacity=16)
    logits = model.decode_step(prompt, cache, mask)
    ids = prompt
    for _ in range(8):
        full = model(ids, mask).logits[:, -1]
        torch.testing.assert_close(logits, full, atol=1e-5, rtol=0)
        next_ids = torch.randint(5, 40, (3, 1))
        ids, mask = (
            torch.cat([ids, next_ids], 1),
            torch.cat([mask, torch.ones(3, 1, dtype=torch.bool)], 1),
        )
        logits = model.decode_step(next_ids, cache)


@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": 1}, *list(VARIANTS.values())[1:]])
@torch.no_grad()
def test_encoder_decoder_cache_matches_full_forward_with_source_padding(overrides):
    model = tiny_model("encoder-decoder", **DECODING, **overrides).eval()
    src, src_mask = padded_batch([7, 4, 2], 7)
    cache = model.new_cache(src, src_mask, capacity=12)
    tgt = torch.ones(3, 1, dtype=torch.long)
    logits = model.decode_step(tgt, cache)
    for _ in range(8):
        full = model(src, tgt, src_mask).logits[:, -1]
        torch.testing.assert_close(logits, full, atol=1e-5, rtol=0)
        next_ids = torch.randint(5, 40, (3, 1))
        tgt = torch.cat([tgt, next_ids], 1)
        logits = model.decode_step(next_ids, cache)


def _three_sentences_on_a_cache():
    """A translation model with three padded sources and three target tokens each on its cache."""
    model = tiny_model("encoder-decoder", **DECODING).eval()
    src, src_mask = padded_batch([7, 4, 2], 7)
    cache = model.new_cache(src, src_mask, capacity=12)
    tgt = torch.tensor([[1, 7, 9], [1, 8, 5], [1, 6, 6]])
    model.decode_step(tgt, cache)
    return model, cache, src, src_mask, tgt


def _next_step_matches_a_full_forward(model, cache, src, src_mask, tgt, rows) -> None:
    """Decode one more token on the cache; compare with a full forward of the sentences `rows`."""
    step = torch.arange(11, 11 + len(rows))[:, None]
    logits = model.decode_step(step, cache)
    full = model(src[rows], torch.cat([tgt[rows], step], 1), src_mask[rows]).logits[:, -1]
    torch.testing.assert_close(logits, full, atol=1e-5, rtol=0)


@pytest.fixture(params=["through rows", "copied"])
def reorder_mode(request, monkeypatch):
    """Reorders that move no keys (a table of rows the step kernel reads through), where the
    kernel runs, and reorders that copy them (and attention in torch operations). Yields the
    mode and a list that records, per kernel call, whether it read through a table."""
    if request.param == "through rows" and not step_attention.available():
        pytest.skip("this CPU has no AVX2: the step kernel that reads through rows is not built")
    if request.param == "copied":
        monkeypatch.setattr(step_attention, "runs_on", lambda device: False)
    calls = []
    attend = step_attention.attend
    monkeypatch.setattr(
        step_attention, "attend", lambda *a, **k: calls.append(a[3] is not None) or attend(*a, **k)
    )
    return request.param, calls


def _read_through_rows(reorder_mode) -> bool:
    """Whether the kernel read through a table (always, in the through-rows mode)."""
    mode, calls = reorder_mode
    return any(calls) or mode == "copied"


# More rows, and, within the batch, rows read and overwritten in one reorder (a cycle,
# a row copied twice), which must move with the values they held before it.
@pytest.mark.parametrize("order", [[2, 0, 2, 1], [0, 1, 2], [2, 0, 0], [1, 2, 0], [0, 0, 1]])
@torch.no_grad()
def test_reorder_follows_rows_and_memory(order, reorder_mode):
    model, cache, src, src_mask, tgt = _three_sentences_on_a_cache()
    index = torch.tensor(order)
    cache.reorder(index)
    _next_step_matches_a_full_forward(model, cache, src, src_mask, tgt, index)
    assert _read_through_rows(reorder_mode) or len(index) > 3  # more rows than held: copied


@torch.no_grad()
def test_reorders_through_rows_move_no_keys_and_chain(reorder_mode):
    """Reorders within the batch, a shrink, more steps, then a larger batch (which copies the
    keys through the table); every step equals a full forward of the rows' histories."""
    model = tiny_model("decoder", **DECODING).eval()
    ids = torch.randint(5, 40, (4, 3))
    cache = model.new_cache(ids, capacity=12)
    model.decode_step(ids, cache)
    buffer = cache.kv.data_ptr()
    for index in ([1, 1, 3, 0], [2, 0, 3, 3], [3, 1]):
        index = torch.tensor(index)
        cache.reorder(index)
        ids = torch.cat([ids[index], torch.randint(5, 40, (len(index), 1))], 1)
        logits = model.decode_step(ids[:, -1:], cache)
        torch.testing.assert_close(logits, model(ids).logits[:, -1], atol=1e-5, rtol=0)
    if reorder_mode[0] == "through rows":
        assert cache.kv.data_ptr() == buffer and cache.rows is not None
    assert _read_through_rows(reorder_mode)
    # Two new positions at once: the torch path, which gathers the keys through the table.
    ids = torch.cat([ids, torch.randint(5, 40, (2, 2))], 1)
    logits = model.decode_step(ids[:, -2:], cache)
    torch.testing.assert_close(logits, model(ids).logits[:, -1], atol=1e-5, rtol=0)
    cache.repeat_rows(3)  # 6 rows, more than the cache's 4
    ids = torch.cat([ids.repeat_interleave(3, 0), torch.randint(5, 40, (6, 1))], 1)
    logits = model.decode_step(ids[:, -1:], cache)
    torch.testing.assert_close(logits, model(ids).logits[:, -1], atol=1e-5, rtol=0)
    assert cache.rows is None and cache.kv.shape[2] == 6


@torch.no_grad()
def test_beams_share_their_sentence_s_memory_and_finished_sentences_leave(reorder_mode):
    model, cache, src, src_mask, tgt = _three_sentences_on_a_cache()
    cache.repeat_rows(2)  # rows: sentence 0 beam 0, sentence 0 beam 1, sentence 1 beam 0, ...
    # One memory per sentence:
    assert cache.batch_size == 6 and cache.kv_cache.memory_kv.shape[2] == 3
    index = torch.tensor([1, 0, 5, 4])  # sentence 1 leaves; beams of 0 and 2 swap
    cache.reorder(index, memory=True)
    assert cache.kv_cache.memory_kv.shape[2] == 2
    _next_step_matches_a_full_forward(model, cache, src, src_mask, tgt, index // 2)
    assert _read_through_rows(reorder_mode)


@torch.no_grad()
def test_cache_overflow_and_batch_mismatch_are_clear_errors():
    model = tiny_model("decoder", **DECODING).eval()
    prompt = torch.randint(5, 40, (2, 4))
    cache = model.new_cache(prompt, capacity=5)
    model.decode_step(prompt, cache)
    with pytest.raises(AttnkitError, match="rows but the cache holds"):
        model.decode_step(torch.ones(3, 1, dtype=torch.long), cache)
    model.decode_step(torch.ones(2, 1, dtype=torch.long), cache)
    with pytest.raises(AttnkitError, match="KV cache holds 5 positions"):
        model.decode_step(torch.ones(2, 1, dtype=torch.long), cache)
    with pytest.raises(AttnkitError, match="max_len"):
        model.new_cache(prompt, capacity=1000)


@pytest.mark.parametrize("positional", ["rope", "xpos", "alibi", "learned"])
@torch.no_grad()
def test_a_sliding_window_cache_is_a_ring_of_window_slots_that_decodes_exactly(positional):
    model = tiny_model("decoder", **DECODING, attention_window=3, positional=positional).eval()
    prompt, mask = left_pad(*padded_batch([5, 2, 4], 5))
    cache = model.new_cache(prompt, mask, capacity=20)
    assert cache.kv.shape[4] == 3  # the window, not the capacity
    logits = model.decode_step(prompt, cache, mask)
    ids = prompt
    # Chunks longer than the window, equal to it, and single tokens, as a prompt continues.
    for n in (4, 1, 3, 1, 1, 2):
        torch.testing.assert_close(logits, model(ids, mask).logits[:, -1], atol=1e-5, rtol=0)
        new = torch.randint(5, 40, (3, n))
        ids, mask = torch.cat([ids, new], 1), torch.cat([mask, torch.ones_like(new).bool()], 1)
        logits = model.decode_step(new, cache)
    torch.testing.assert_close(logits, model(ids, mask).logits[:, -1], atol=1e-5, rtol=0)
    assert cache.kv.shape[4] == 3 and cache.length == ids.shape[1]


def test_strided_attention_keeps_every_position():
    model = tiny_model("decoder", **DECODING, attention_window=2, attention_stride=3).eval()
    cache = model.new_cache(torch.ones(1, 4, dtype=torch.long), capacity=20)
    assert cache.kv.shape[4] == 20  # strided keys reach back past any window
