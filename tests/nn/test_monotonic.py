"""The monotonic window (`nn/monotonic.py`) of an encoder-decoder's decode: each row's window
over the source, its focus, rows that reorder, and the cross-attention that stays inside it,
for rows alone or sharing a memory."""

import pytest
import torch

from attnkit import AttnkitError
from attnkit.models.decoding_state import DecodingState
from attnkit.nn import MultiHeadAttention
from attnkit.nn.attention import AttentionInputs
from attnkit.nn.kv_cache import KVCache
from attnkit.nn.monotonic import MonotonicWindow
from tests.helpers import DECODING, padded_batch, tiny_model


def state_of(lengths: list[int], width: int, *, left: bool = False) -> DecodingState:
    """An encoder-decoder's decoding state over sources of these real lengths, padded to `width`."""
    model = tiny_model("encoder-decoder", **DECODING).eval()
    src, mask = padded_batch(lengths, width)
    if left:
        src, mask = src.flip(-1), mask.flip(-1)
    with torch.no_grad():
        return model.new_cache(src, mask, capacity=8)


def allowed(rows: list[list[int]], width: int) -> torch.Tensor:
    """(batch, 1, 1, width) True at these slots of each row."""
    window = torch.zeros(len(rows), width, dtype=torch.bool)
    for row, positions in enumerate(rows):
        window[row, positions] = True
    return window[:, None, None]


@pytest.mark.parametrize("left", [False, True])
def test_the_window_surrounds_each_rows_focus_within_its_real_source(left):
    state = state_of([7, 4, 2], 7, left=left)
    state.set_monotonic(1, 2)
    expected = [[0, 1, 2], [0, 1, 2], [0, 1]]  # focus 0: nothing behind it
    if left:  # positions count real tokens: a left-padded source starts at 0 too
        expected = [[p + 7 - n for p in row] for row, n in zip(expected, [7, 4, 2], strict=True)]
    assert torch.equal(state.window.keys(), allowed(expected, 7))
    state.window.focus = torch.tensor([4, 3, 1])
    expected = [[3, 4, 5, 6], [2, 3], [0, 1]]
    if left:
        expected = [[p + 7 - n for p in row] for row, n in zip(expected, [7, 4, 2], strict=True)]
    assert torch.equal(state.window.keys(), allowed(expected, 7))


def test_the_focus_moves_to_the_most_attended_position_averaged_over_heads():
    real = torch.tensor([[True] * 5, [False, False, True, True, True]])
    window = MonotonicWindow(0, 3, real)
    weights = torch.zeros(2, 2, 1, 5)  # (batch, heads, queries, keys)
    weights[0, 0, 0, 3], weights[0, 1, 0, 1] = 0.6, 0.5  # head 0 peaks at 3, but on average:
    weights[0, 1, 0, 3], weights[0, 0, 0, 1] = 0.1, 0.3  # 3: 0.35, 1: 0.4
    weights[1, :, 0, 4] = 1.0  # slot 4 of a left-padded source of 3: its position 2
    window.move(weights)
    assert window.focus.tolist() == [1, 2]


def test_the_focus_follows_reordered_and_repeated_rows():
    state = state_of([6, 5, 3], 6)
    state.set_monotonic(0, 1)
    state.window.focus = torch.tensor([4, 2, 1])
    state.repeat_rows(2)  # beams: rows sentence * 2 + beam
    assert state.window.focus.tolist() == [4, 4, 2, 2, 1, 1]
    state.reorder(torch.tensor([1, 0, 3, 3, 5, 4]), memory=False)
    state.window.focus = torch.tensor([4, 3, 2, 1, 1, 2])
    assert torch.equal(
        state.window.keys(), allowed([[4, 5], [3, 4], [2, 3], [1, 2], [1, 2], [2]], 6)
    )
    state.reorder(torch.tensor([4, 5]), memory=True)  # only the last sentence goes on
    assert state.window.focus.tolist() == [1, 2]
    assert torch.equal(state.window.keys(), allowed([[1, 2], [2]], 6))
    assert state.kv_cache.memory_kv.shape[2] == 1  # and its memory alone


def test_a_window_reaches_zero_or_more_behind_and_one_or_more_ahead():
    with pytest.raises(AttnkitError, match="got back -1 and ahead 2"):
        state_of([3], 3).set_monotonic(-1, 2)
    with pytest.raises(AttnkitError, match="got back 1 and ahead 0"):
        MonotonicWindow(1, 0, torch.ones(1, 3, dtype=torch.bool))


@torch.no_grad()
def test_rows_sharing_a_memory_attend_within_their_windows_as_rows_with_their_own():
    """Beams (`repeat_rows`) attend within their own windows as copies of the memory do."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, cross=True).eval()
    memory = torch.randn(2, 6, 16)
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])

    def state(shared: bool) -> DecodingState:
        kv = KVCache(2, 2, 4, 4, 4)
        kv.set_memory([attn.memory_kv(memory)] * 2, mask)
        s = DecodingState(kv)
        if shared:
            s.repeat_rows(3)
        else:  # each row its own copy of its sentence's memory
            s.reorder(torch.tensor([0, 0, 0, 1, 1, 1]), memory=True)
        s.set_monotonic(1, 1)
        s.window.focus = torch.tensor([0, 2, 5, 1, 3, 3])
        s.kv_cache.extend(None, 1)
        return s

    x = torch.randn(6, 1, 16)
    shared, own = state(True), state(False)
    inputs = AttentionInputs(memory_window=shared.window.keys())
    out, weights = attn(x, inputs, shared.kv_cache.layers[1], need_weights=True)
    out_own, weights_own = attn(x, inputs, own.kv_cache.layers[1], need_weights=True)
    torch.testing.assert_close(out, out_own, atol=1e-6, rtol=0)
    torch.testing.assert_close(weights, weights_own, atol=1e-6, rtol=0)
    window = allowed([[0, 1], [1, 2, 3], [4, 5], [0, 1, 2], [2, 3], [2, 3]], 6)
    assert torch.equal(shared.window.keys(), window)
    assert torch.all(weights.masked_fill(window, 0) == 0)
    assert torch.allclose(weights.sum(-1), torch.ones(6, 4, 1))
