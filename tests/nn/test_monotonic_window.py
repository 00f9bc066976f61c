"""The monotonic window of a decoding cache: each row's window over the source, its focus,
and the cross-attention that stays inside the window, for rows alone or sharing a memory."""

import pytest
import torch

from attnkit import AttnkitError
from attnkit.nn import MultiHeadAttention
from attnkit.nn.kv_cache import KVCache
from tests.helpers import DECODING, padded_batch, tiny_model


def cache_of(lengths: list[int], width: int, *, left: bool = False) -> KVCache:
    """An encoder-decoder's cache over sources of these real lengths, padded to `width`."""
    model = tiny_model("encoder-decoder", **DECODING).eval()
    src, mask = padded_batch(lengths, width)
    if left:
        src, mask = src.flip(-1), mask.flip(-1)
    with torch.no_grad():
        return model.new_cache(src, mask, capacity=8)


def allowed(rows: list[list[int]], width: int, *, left: bool = False) -> torch.Tensor:
    """(batch, 1, 1, width) True at these real positions of each row (counted over real tokens)."""
    window = torch.zeros(len(rows), width, dtype=torch.bool)
    for row, positions in enumerate(rows):
        window[row, positions] = True
    return window[:, None, None]


@pytest.mark.parametrize("left", [False, True])
def test_the_window_surrounds_each_rows_focus_within_its_real_source(left):
    cache = cache_of([7, 4, 2], 7, left=left)
    cache.set_monotonic(1, 2)
    cache.extend(None, 1)
    expected = [[0, 1, 2], [0, 1, 2], [0, 1]]  # focus 0: nothing behind it
    if left:
        expected = [[p + 7 - n for p in row] for row, n in zip(expected, [7, 4, 2], strict=True)]
    assert torch.equal(cache.memory_window, allowed(expected, 7))
    cache.focus = torch.tensor([4, 3, 1])
    cache.extend(None, 1)
    expected = [[3, 4, 5, 6], [2, 3], [0, 1]]
    if left:
        expected = [[p + 7 - n for p in row] for row, n in zip(expected, [7, 4, 2], strict=True)]
    assert torch.equal(cache.memory_window, allowed(expected, 7))


def test_the_focus_moves_to_the_most_attended_position_averaged_over_heads():
    cache = cache_of([5, 3], 5, left=True)
    cache.set_monotonic(0, 3)
    weights = torch.zeros(2, 2, 1, 5)  # (batch, heads, queries, keys)
    weights[0, 0, 0, 3], weights[0, 1, 0, 1] = 0.6, 0.5  # head 0 peaks at 3, but on average:
    weights[0, 1, 0, 3], weights[0, 0, 0, 1] = 0.1, 0.3  # 3: 0.35, 1: 0.4
    weights[1, :, 0, 4] = 1.0  # slot 4 of a left-padded source of 3: its position 2
    cache.layers[-1].move_focus(weights)
    assert cache.focus.tolist() == [1, 2]


def test_the_focus_follows_reordered_and_repeated_rows():
    cache = cache_of([6, 5, 3], 6)
    cache.set_monotonic(0, 1)
    cache.focus = torch.tensor([4, 2, 1])
    cache.repeat_rows(2)  # beams: rows sentence * 2 + beam
    assert cache.focus.tolist() == [4, 4, 2, 2, 1, 1]
    cache.reorder(torch.tensor([1, 0, 3, 3, 5, 4]), memory=False)
    cache.focus = torch.tensor([4, 3, 2, 1, 1, 2])
    cache.extend(None, 1)
    assert torch.equal(
        cache.memory_window,
        allowed([[4, 5], [3, 4], [2, 3], [1, 2], [1, 2], [2]], 6),
    )
    cache.reorder(torch.tensor([4, 5]), memory=True)  # only the last sentence goes on
    cache.extend(None, 1)
    assert cache.focus.tolist() == [1, 2]
    assert torch.equal(cache.memory_window, allowed([[1, 2], [2]], 6))


def test_a_window_needs_a_memory_and_reaches_zero_or_more():
    decoder_cache = tiny_model("decoder", **DECODING).new_cache(torch.ones(1, 2, dtype=torch.long))
    with pytest.raises(AttnkitError, match="which this cache has none of"):
        decoder_cache.set_monotonic(1, 1)
    with pytest.raises(AttnkitError, match="got back -1 and ahead 2"):
        cache_of([3], 3).set_monotonic(-1, 2)


@torch.no_grad()
@pytest.mark.parametrize("last", [True, False])
def test_rows_sharing_a_memory_attend_as_rows_with_their_own(last):
    """Beams (`repeat_rows`) attend within their own windows as copies of the memory do."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, cross=True).eval()
    memory = torch.randn(2, 6, 16)
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    layers = 2 if last else 3  # the attention is the last of the cache's two layers, or not

    def cache(shared: bool) -> KVCache:
        c = KVCache(layers, 2, 4, 4, 4)
        c.set_memory([attn.memory_kv(memory)] * layers, mask)
        if shared:
            c.repeat_rows(3)
        else:  # each row its own copy of its sentence's memory
            c.reorder(torch.tensor([0, 0, 0, 1, 1, 1]), memory=True)
        c.set_monotonic(1, 1)
        c.focus = torch.tensor([0, 2, 5, 1, 3, 3])
        c.extend(None, 1)
        return c

    x = torch.randn(6, 1, 16)
    shared, own = cache(True), cache(False)
    out, weights = attn(x, cache=shared.layers[1], need_weights=True)
    out_own, weights_own = attn(x, cache=own.layers[1], need_weights=True)
    torch.testing.assert_close(out, out_own, atol=1e-6, rtol=0)
    torch.testing.assert_close(weights, weights_own, atol=1e-6, rtol=0)
    window = allowed([[0, 1], [1, 2, 3], [4, 5], [0, 1, 2], [2, 3], [2, 3]], 6)
    assert torch.all(weights.masked_fill(window, 0) == 0)
    assert torch.allclose(weights.sum(-1), torch.ones(6, 4, 1))
    # Only the last layer moves the focus, to where its heads attend most on average.
    moved = weights[:, :, 0].mean(1).argmax(-1)
    expected = moved if last else torch.tensor([0, 2, 5, 1, 3, 3])
    assert torch.equal(shared.focus, expected) and torch.equal(own.focus, expected)
