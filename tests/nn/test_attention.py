"""Attention against torch's own implementation, and the two attention paths against each other."""

import pytest
import torch
from torch import nn

from attnkit.nn import (
    AttentionInputs,
    AttentionPath,
    MultiHeadAttention,
    Window,
    causal_mask,
    scaled_dot_product_attention,
    self_attention_mask,
)
from attnkit.nn.local_attention import local_attention
from attnkit.nn.masks import local_mask, slot_distance
from tests.helpers import copy_from_torch


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_equals_torch_multihead_attention(causal: bool, need_weights: bool) -> None:
    d, h, b, n = 32, 4, 3, 7
    ref = nn.MultiheadAttention(d, h, batch_first=True).eval()
    ours = MultiHeadAttention(d, h).eval()
    copy_from_torch(ours, ref)
    x = torch.randn(b, n, d)
    key_mask = torch.ones(b, n, dtype=torch.bool)
    key_mask[1, 5:] = False
    key_mask[2, 3:] = False
    expected, expected_w = ref(
        x,
        x,
        x,
        key_padding_mask=~key_mask,
        attn_mask=~causal_mask(n, n) if causal else None,
        need_weights=True,
        average_attn_weights=False,
    )
    mask = self_attention_mask(key_mask, n, causal)
    path = AttentionPath.WEIGHTS if need_weights else AttentionPath.FUSED
    out, weights = ours(x, AttentionInputs(path=path, mask=mask))
    real = key_mask  # padded query rows are free to differ; real ones must not
    torch.testing.assert_close(out[real], expected[real], atol=1e-5, rtol=1e-5)
    if need_weights:
        # (batch, heads, queries, keys) -> rows of real queries: (n_real, heads, keys)
        torch.testing.assert_close(
            weights.transpose(1, 2)[real], expected_w.transpose(1, 2)[real], atol=1e-5, rtol=1e-5
        )


def test_cross_attention_equals_torch_multihead_attention() -> None:
    d, h = 32, 8
    ref = nn.MultiheadAttention(d, h, batch_first=True).eval()
    ours = MultiHeadAttention(d, h, cross=True).eval()
    copy_from_torch(ours, ref)
    x, memory = torch.randn(2, 5, d), torch.randn(2, 9, d)
    memory_mask = torch.ones(2, 9, dtype=torch.bool)
    memory_mask[0, 6:] = False
    expected, _ = ref(x, memory, memory, key_padding_mask=~memory_mask)
    out, _ = ours(x, AttentionInputs(memory=memory, memory_mask=memory_mask[:, None, None, :]))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_attention_called_alone_attends_to_every_key() -> None:
    """`mha(x)`, with no inputs, is unmasked self-attention, as `mha(x, AttentionInputs())`."""
    d, h = 32, 4
    ref = nn.MultiheadAttention(d, h, batch_first=True).eval()
    ours = MultiHeadAttention(d, h).eval()
    copy_from_torch(ours, ref)
    x = torch.randn(2, 6, d)
    out, weights = ours(x)
    assert weights is None
    torch.testing.assert_close(out, ours(x, AttentionInputs())[0], atol=0, rtol=0)
    torch.testing.assert_close(out, ref(x, x, x)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding+causal", "padding"])
def test_reference_and_sdpa_paths_agree(n_kv_heads: int, mask_kind: str) -> None:
    b, h, n, dk = 2, 4, 6, 8
    q = torch.randn(b, h, n, dk, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, n_kv_heads, n, dk, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, n_kv_heads, n, dk, dtype=torch.float64, requires_grad=True)
    key_mask = torch.tensor([[True] * n, [True] * 4 + [False] * (n - 4)])
    mask, is_causal = {
        "none": (None, False),
        "causal": (None, True),
        "padding+causal": (self_attention_mask(key_mask, n, causal=True), False),
        "padding": (self_attention_mask(key_mask, n, causal=False), False),
    }[mask_kind]
    results = []
    for need_weights in (True, False):
        out, weights = scaled_dot_product_attention(
            q, k, v, mask, is_causal=is_causal, need_weights=need_weights
        )
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        results.append((out, grads))
        assert (weights is not None) == need_weights
    (out_ref, grads_ref), (out_fast, grads_fast) = results
    torch.testing.assert_close(out_fast, out_ref)
    for g_fast, g_ref in zip(grads_fast, grads_ref, strict=True):
        torch.testing.assert_close(g_fast, g_ref)


def test_attention_weights_are_distributions_that_respect_the_mask() -> None:
    q = k = v = torch.randn(1, 2, 5, 4)
    _, weights = scaled_dot_product_attention(q, k, v, is_causal=True, need_weights=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 2, 5))
    assert (weights.masked_select(~causal_mask(5, 5)) == 0).all()


def test_causal_mask_with_a_cache_is_aligned_to_the_last_queries() -> None:
    # Two new queries at positions 3 and 4 of 5 keys see keys 0..3 and 0..4.
    expected = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(causal_mask(2, 5), expected)


@pytest.mark.parametrize("n_heads", [1, 2, 4, 8, 16])
def test_multi_head_attention_has_4_d_squared_weights_whatever_the_heads(n_heads: int) -> None:
    d = 64
    mha = MultiHeadAttention(d, n_heads)
    weights = sum(p.numel() for name, p in mha.named_parameters() if name.endswith("weight"))
    biases = sum(p.numel() for name, p in mha.named_parameters() if name.endswith("bias"))
    assert (weights, biases) == (4 * d * d, 4 * d)
    cross = MultiHeadAttention(d, n_heads, cross=True)
    assert sum(p.numel() for p in cross.parameters()) == 4 * d * d + 4 * d


def test_grouped_query_attention_shrinks_only_the_key_value_projections() -> None:
    d, h = 64, 8
    for n_kv in (8, 4, 1):
        mha = MultiHeadAttention(d, h, n_kv, bias=False)
        kv = 2 * d * (d // h) * n_kv
        assert sum(p.numel() for p in mha.parameters()) == 2 * d * d + kv


def test_sliding_window_mask_is_mistrals() -> None:
    # Query i sees keys i-2, i-1, i: a window of 3, causal.
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [0, 1, 1, 1, 0],
            [0, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(local_mask(slot_distance(5, 5), 3, causal=True), expected)
    # With a cache the queries are the last rows.
    assert torch.equal(local_mask(slot_distance(2, 5), 3, causal=True), expected[3:])
    # An encoder's window reaches both ways.
    assert torch.equal(local_mask(slot_distance(5, 5), 3, causal=False), expected | expected.T)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    ("length", "window", "stride"),
    [(12, 3, 0), (11, 3, 0), (7, 2, 0), (4, 4, 0), (3, 5, 0), (12, 3, 3), (20, 4, 5), (9, 4, 2)],
)
@pytest.mark.parametrize("n_kv_heads", [4, 2])
@pytest.mark.parametrize("padded", [False, True])
def test_blockwise_window_equals_the_masked_one(causal, length, window, stride, n_kv_heads, padded):
    # Lengths that are and are not a multiple of the window (and of the stride), shorter than
    # it, a stride below, equal to and above the window, GQA, and padding on the right of one
    # sequence and on the left of the other.
    torch.manual_seed(length + window + stride)
    q = torch.randn(2, 4, length, 8, dtype=torch.float64, requires_grad=True)
    k, v = (
        torch.randn(2, n_kv_heads, length, 8, dtype=torch.float64, requires_grad=True)
        for _ in range(2)
    )
    key_mask = None
    mask = local_mask(slot_distance(length, length), window, stride, causal=causal)
    if padded:
        key_mask = torch.ones(2, length, dtype=torch.bool)
        key_mask[0, -2:] = key_mask[1, :1] = False
        mask = mask & self_attention_mask(key_mask, length, causal)
    expected, _ = scaled_dot_product_attention(q, k, v, mask)
    out = local_attention(q, k, v, window, stride, causal=causal, key_mask=key_mask)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    for ours, theirs in zip(grads, torch.autograd.grad(expected, (q, k, v), grad), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)


def test_blocks_run_only_where_they_pay() -> None:
    assert Window(64).runs_blockwise(512) and Window(256).runs_blockwise(4096)
    assert not Window(256).runs_blockwise(512)  # two windows: every key is a neighbour
    assert not Window(16).runs_blockwise(128)  # short: full attention is as fast
    assert not Window(0).runs_blockwise(4096)  # no window
    # Strided: longer.
    assert Window(32, 32).runs_blockwise(1024) and not Window(16, 16).runs_blockwise(256)


@pytest.mark.parametrize(
    ("window", "length", "need_weights", "cached", "alibi", "path"),
    [
        (64, 512, False, False, False, AttentionPath.BLOCKWISE),
        (64, 128, False, False, False, AttentionPath.FUSED),  # short: the mask is as fast
        (0, 512, False, False, False, AttentionPath.FUSED),  # no window
        (64, 512, True, False, False, AttentionPath.WEIGHTS),  # only the masked paths give them
        (64, 512, True, True, False, AttentionPath.WEIGHTS),
        (64, 512, False, True, False, AttentionPath.FUSED),  # decoding: new queries over held keys
        (64, 512, False, False, True, AttentionPath.FUSED),  # ALiBi biases every score
    ],
)
def test_the_path_is_blockwise_only_for_a_long_window_without_weights_cache_or_alibi(
    window: int, length: int, need_weights: bool, cached: bool, alibi: bool, path: AttentionPath
) -> None:
    chosen = AttentionPath.choose(
        length, Window(window), need_weights=need_weights, cached=cached, alibi=alibi
    )
    assert chosen is path


def test_a_cache_is_a_ring_only_under_a_plain_window_shorter_than_it() -> None:
    assert Window(4).cache_slots(20) == 4
    assert Window(4, 4).cache_slots(20) == 20  # strided keys reach back past the window
    assert Window(32).cache_slots(20) == 20
    assert Window().cache_slots(20) == 20


def test_strided_sparse_mask_adds_every_stride_th_key() -> None:
    mask = local_mask(slot_distance(9, 9), 2, 3, causal=True)
    for i in range(9):
        seen = {j for j in range(9) if mask[i, j]}
        local = {j for j in (i - 1, i) if j >= 0}
        strided = {j for j in range(i + 1) if (i - j) % 3 == 0}
        assert seen == local | strided, i
    # Each query sees O(window + length / stride) keys, not all of them.
    assert mask[8].sum() == 4  # keys 7, 8 (window) and 2, 5 (stride; 8 is both)


@pytest.mark.parametrize(("queries", "kv_heads", "causal"), [(1, 8, False), (4, 2, True)])
def test_a_decoding_step_of_many_rows_takes_the_plain_products_and_equals_sdpa(
    queries: int, kv_heads: int, causal: bool
) -> None:
    """32 rows x 8 heads of a few queries (beam search on the cache) skip the fused kernel."""
    from attnkit.nn import sdpa_backend

    q = torch.randn(32, 8, queries, 16)
    k, v = torch.randn(32, kv_heads, 20, 16), torch.randn(32, kv_heads, 20, 16)
    mask = torch.rand(32, 1, queries, 20) > 0.2
    mask[..., -1] = True  # each query sees at least its own (last) key
    given = None if causal else mask
    with torch.no_grad():
        ran = sdpa_backend.kernels_run(
            lambda: scaled_dot_product_attention(q, k, v, given, is_causal=causal)
        )
        out, weights = scaled_dot_product_attention(q, k, v, given, is_causal=causal)
        bottom_right = torch.ones(queries, 20, dtype=torch.bool).tril(20 - queries)
        expected = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=bottom_right if causal else mask, enable_gqa=kv_heads < 8
        )
    assert not ran and weights is None  # no fused kernel, and no weights asked for
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def _blinded(kind: str) -> dict:
    """Masks and biases under which some query of (2, 2, 3 queries, 4 keys) sees no key."""
    mask = torch.ones(2, 1, 3, 4, dtype=torch.bool)
    mask[1, :, 0] = False  # the first query of the second sentence sees nothing
    padding = torch.ones(2, 1, 1, 4, dtype=torch.bool)
    padding[1] = False  # the second sentence is all padding
    bias = torch.randn(1, 2, 3, 4)
    if kind == "per query":
        return {"mask": mask}
    if kind == "padding":
        return {"mask": padding}
    if kind == "2-D":
        return {"mask": torch.tensor([[True] * 4, [False] * 4, [True, False, True, False]])}
    if kind == "bias":
        return {"bias": bias.masked_fill(~mask, float("-inf"))}
    if kind == "mask and bias":  # neither alone hides every key of query 2
        split = torch.tensor([True, True, False, False])
        return {"mask": (mask & split).clone(), "bias": bias.masked_fill(split, float("-inf"))}
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["per query", "padding", "2-D", "bias", "mask and bias"])
def test_a_query_that_may_see_no_key_gets_zeros_and_finite_gradients(kind: str) -> None:
    """On the weights path as from the fused kernel: zeros, and no NaN in any gradient."""
    q = torch.randn(2, 2, 3, 8, requires_grad=True)
    k, v = torch.randn(2, 2, 4, 8), torch.randn(2, 2, 4, 8)
    given = _blinded(kind)
    out, weights = scaled_dot_product_attention(q, k, v, need_weights=True, **given)
    out.sum().backward()
    float_mask = torch.zeros(2, 2, 3, 4)
    if "bias" in given:
        float_mask = float_mask + given["bias"]
    if "mask" in given:
        float_mask = float_mask.masked_fill(~given["mask"], float("-inf"))
    blind = torch.isneginf(float_mask).all(-1)
    assert blind.any() and torch.isfinite(q.grad).all()
    assert torch.all(out[blind] == 0) and torch.all(weights[blind] == 0)
    assert torch.all(q.grad[blind] == 0)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=float_mask)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_cross_attention_to_an_all_padding_source_gives_zeros_on_either_path() -> None:
    layer = MultiHeadAttention(16, 4, cross=True)
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    memory_mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    memory_mask[1] = False
    inputs = AttentionInputs(memory=memory, memory_mask=memory_mask)
    fused, _ = layer(x, inputs)
    plain, weights = layer(x, inputs, need_weights=True)
    torch.testing.assert_close(plain, fused, atol=1e-5, rtol=1e-5)
    assert torch.all(weights[1] == 0) and torch.isfinite(plain).all()
