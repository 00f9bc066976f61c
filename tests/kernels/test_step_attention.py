"""The decoding step's attention kernel equals the reference attention, reading the keys in
place, through beam search's table of rows, with masks, biases and grouped heads."""

from __future__ import annotations

import pytest
import torch

from attnkit.kernels import step_attention
from attnkit.nn.scaled_dot_product import scaled_dot_product_attention

pytestmark = pytest.mark.skipif(
    not step_attention.available(), reason="this CPU has no AVX2: the step kernel is not built"
)


def reference(q, k, v, mask=None, bias=None):
    """The plain path's softmax(q k^T / sqrt(d) + bias + mask) v as (batch, queries, heads * d)."""
    with torch.no_grad():
        out, _ = scaled_dot_product_attention(q, k, v, mask, bias=bias, need_weights=True)
    return out.transpose(1, 2).flatten(2)


def attend(*args, **kwargs):
    with torch.no_grad():
        return step_attention.attend(*args, **kwargs)


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 8), (8, 2), (4, 1)])
@pytest.mark.parametrize(("queries", "keys"), [(1, 1), (1, 37), (6, 9)])
def test_it_equals_the_reference_attention(heads, kv_heads, queries, keys):
    d = 64
    q = torch.randn(5, heads, queries, d)
    k, v = torch.randn(5, kv_heads, keys, d), torch.randn(5, kv_heads, keys, d)
    torch.testing.assert_close(attend(q, k, v), reference(q, k, v), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("d", [8, 24, 40, 64, 100])
def test_any_head_size_in_and_off_its_vector_steps(d):
    q, k, v = torch.randn(3, 2, 1, d), torch.randn(3, 2, 11, d), torch.randn(3, 2, 11, d)
    torch.testing.assert_close(attend(q, k, v), reference(q, k, v), atol=2e-6, rtol=1e-5)


def test_it_reads_views_in_place_the_fused_projection_and_the_cache():
    """q split from a fused (batch, 1, 3 * heads * d) projection; k and v the first keys of
    a (batch, heads, slots, d) buffer: strided, no copies needed."""
    qkv = torch.randn(4, 1, 3 * 8 * 16)
    q = qkv[..., : 8 * 16].unflatten(-1, (8, 16)).transpose(1, 2)
    cache = torch.randn(2, 4, 8, 30, 16)
    k, v = cache[0, :, :, :12], cache[1, :, :, :12]
    assert not q.is_contiguous() and not k.is_contiguous()
    expected = reference(q.contiguous(), k.contiguous(), v.contiguous())
    torch.testing.assert_close(attend(q, k, v), expected, atol=2e-6, rtol=1e-5)


def test_masks_per_row_and_per_query_and_a_bias_per_head():
    q, k, v = torch.randn(3, 4, 5, 32), torch.randn(3, 4, 10, 32), torch.randn(3, 4, 10, 32)
    for mask in (torch.rand(3, 1, 1, 10) > 0.4, torch.rand(3, 1, 5, 10) > 0.4):
        mask[..., 0] = True  # every query sees a key
        bias = torch.randn(1, 4, 5, 10)
        torch.testing.assert_close(
            attend(q, k, v, mask=mask, bias=bias),
            reference(q, k, v, mask, bias),
            atol=2e-6,
            rtol=1e-5,
        )


def test_a_row_with_every_key_masked_gives_zeros():
    q, k, v = torch.randn(2, 2, 1, 16), torch.randn(2, 2, 4, 16), torch.randn(2, 2, 4, 16)
    mask = torch.ones(2, 1, 1, 4, dtype=torch.bool)
    mask[1] = False
    out = attend(q, k, v, mask=mask)
    assert (out[1] == 0).all()
    torch.testing.assert_close(out[0], reference(q[:1], k[:1], v[:1])[0], atol=2e-6, rtol=1e-5)


def test_it_reads_each_rows_keys_where_the_table_says():
    """rows[b, p]: the cache row holding row b's key at position p (beam search's history)."""
    cache = torch.randn(2, 7, 2, 16, 32)  # (k/v, cache rows, kv heads, slots, d)
    rows = torch.randint(0, 7, (5, 13))
    q = torch.randn(5, 4, 1, 32)
    positions = torch.arange(13)
    k, v = (cache[i][rows, :, positions].transpose(1, 2) for i in (0, 1))  # (5, 2, 13, 32)
    torch.testing.assert_close(
        attend(q, cache[0], cache[1], rows), reference(q, k, v), atol=2e-6, rtol=1e-5
    )


def test_long_contexts_and_no_keys():
    """The scores live on the heap (a thread's stack would not hold 300,000); no keys: zeros."""
    q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 1, 300_000, 8), torch.randn(1, 1, 300_000, 8)
    torch.testing.assert_close(attend(q, k, v), reference(q, k, v), atol=1e-5, rtol=1e-4)
    empty = torch.randn(1, 1, 0, 8)
    assert (attend(q, empty, empty) == 0).all()
