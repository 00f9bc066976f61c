"""Scaled dot-product attention, masks, and multi-head attention.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + M) V                 (eq. 1)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)                      (section 3.2.2)

M is 0 where a query may look at a key and -inf where it may not. Masks here
are boolean tensors broadcastable to (batch, heads, queries, keys) with True
where attention is allowed, the convention of `F.scaled_dot_product_attention`.
An additive float bias (ALiBi) and a rotation of queries and keys (RoPE) plug
in through `bias` and `rotary` without touching the rest.

Local and sparse attention are masks too: a sliding window lets query i see
key j only when |i - j| < w (Mistral, Longformer); the strided pattern of the
Sparse Transformer (Child et al. 2019) adds the keys a multiple of the stride
away, so that two layers connect any two positions. A mask only removes
scores, so its cost stays that of full attention. A plain window over a
sequence longer than two windows (and than `BLOCKWISE_MIN_LENGTH`) is
computed block by block instead (`local_attention`): each block of w queries
reads only its own and the neighbouring blocks of keys, O(length x w) rather
than O(length^2); the strided keys, taken column by column, add
O(length^2 / stride).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.errors import AttnkitError
from attnkit.nn.linear import Linear

if TYPE_CHECKING:
    from attnkit.nn.kv_cache import LayerKV


class Rotary(Protocol):
    """Rotates queries and keys by their positions before the dot product (RoPE)."""

    def __call__(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> tuple[Tensor, Tensor]: ...


def causal_mask(q_len: int, k_len: int, device: torch.device | None = None) -> Tensor:
    """(q_len, k_len) boolean mask, True on and below the diagonal.

    When there are fewer queries than keys (decoding with a cache) the queries
    are the last `q_len` positions, so the diagonal is aligned bottom-right.
    """
    ones = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    return ones.tril(diagonal=k_len - q_len)


def slot_distance(q_len: int, k_len: int, device: torch.device | None = None) -> Tensor:
    """(q_len, k_len) distance i - j from each query to each key; the queries are the last keys."""
    q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    return q_pos - torch.arange(k_len, device=device)[None]


def local_mask(distance: Tensor, window: int, stride: int = 0, *, causal: bool) -> Tensor:
    """Boolean mask of a sliding window of `window` keys, plus strided keys, from distances.

    `distance` holds i - j for each query i and key j (`slot_distance`). Query i
    sees key j when d = i - j (|i - j| if not causal) is below `window`, or,
    with a `stride`, is a multiple of it.
    """
    d = distance if causal else distance.abs()
    allowed = d < window
    if stride:
        allowed |= d % stride == 0
    return allowed & (d >= 0)


# Below these many positions the mask (full attention) is as fast as the blocks or faster
# (bench/bench_window.py: a window of 32 alone 0.69x at 128 positions, 1.02x at 256, 2.03x at
# 512; a window and a stride of 32, 0.45x at 256, 1.21x at 512, 1.73x at 1,024).
BLOCKWISE_MIN_LENGTH = 256
STRIDED_MIN_LENGTH = 512


def runs_blockwise(length: int, window: int, stride: int = 0) -> bool:
    """Whether a window (and stride) over `length` positions pays for `local_attention`."""
    shortest = STRIDED_MIN_LENGTH if stride else BLOCKWISE_MIN_LENGTH
    return 0 < 2 * window < length and length >= shortest


def local_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    stride: int = 0,
    *,
    causal: bool,
    key_mask: Tensor | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Attention over a sliding window of `window` keys (plus strided keys), block by block.

    Computes what `scaled_dot_product_attention` computes with the mask
    `local_mask` (and `self_attention_mask` for padding), on q, k, v of shape
    (batch, heads, length, d_k); `key_mask` (batch, length) is True for real
    tokens. The window is Longformer's chunks: the sequence is cut into blocks
    of w = `window` positions, and query i of block c may only see keys of
    blocks c - 1 and c (and c + 1 when not causal), since |i - j| < w. Each
    block attends over those 2w (3w) keys with the window as its mask,
    O(length x w).

    With a `stride` s (the Sparse Transformer's strided pattern) query i also
    sees the keys j with i - j a multiple of s: those of its own residue
    i mod s. Laid out as s columns of length / s positions, each column attends
    within itself, O(length^2 / s); the scores of both parts share one softmax,
    keys in the window counted once.
    """
    batch, heads, length, d_k = q.shape
    w = window
    n = -(-length // w)  # blocks, the last one padded
    pad = n * w - length
    # Key blocks per query block: the previous, its own, and (both ways) the next.
    shifts = (1, 0) if causal else (1, 0, -1)

    def to_blocks(x: Tensor) -> Tensor:
        """(batch, h, length, e) -> (batch * n, h, w, e), zero-padded at the end."""
        return F.pad(x, (0, 0, 0, pad)).unflatten(2, (n, w)).transpose(1, 2).flatten(0, 1)

    def from_blocks(x: Tensor) -> Tensor:
        return x.unflatten(0, (batch, n)).transpose(1, 2).flatten(2, 3)[:, :, :length]

    def neighbours(x: Tensor) -> Tensor:
        """(batch, h, length, d) -> (batch * n, h, len(shifts) * w, d): each block's keys."""
        x = F.pad(x, (0, 0, w, pad + w)).unflatten(2, (n + 2, w))  # an empty block each side
        parts = [x[:, :, 1 - shift : n + 1 - shift] for shift in shifts]
        return torch.cat(parts, 3).transpose(1, 2).flatten(0, 1)

    # Positions of the queries (n, w, 1) and of each block's keys (n, 1, keys).
    blocks = torch.arange(n, device=q.device)
    offsets = torch.cat([torch.arange(w, device=q.device) - shift * w for shift in shifts])
    query_at = (blocks[:, None] * w + torch.arange(w, device=q.device))[:, :, None]
    key_at = (blocks[:, None] * w + offsets)[:, None, :]
    distance = query_at - key_at
    allowed = local_mask(distance, w, causal=causal)
    # Keys before the start or past the end are the zero padding of the blocks.
    inside = (key_at >= 0) & (key_at < length)
    if key_mask is None:
        mask = (allowed & inside).expand(batch, -1, -1, -1)
    else:
        real = F.pad(key_mask.bool(), (w, pad + w))[:, key_at.squeeze(1) + w]  # (batch, n, keys)
        # As in `self_attention_mask`, a padding query still sees its own key.
        mask = (allowed & inside & real[:, :, None, :]) | (distance == 0)
    mask = mask.flatten(0, 1)[:, None]
    if not stride:
        out = F.scaled_dot_product_attention(
            to_blocks(q),
            neighbours(k),
            neighbours(v),
            attn_mask=mask,
            dropout_p=dropout_p,
            enable_gqa=heads != k.shape[1],
        )
        return from_blocks(out)
    k, v = (x.repeat_interleave(heads // k.shape[1], dim=1) for x in (k, v))  # GQA
    keys, values = neighbours(k), neighbours(v)
    in_window = from_blocks(to_blocks(q) @ keys.transpose(-2, -1)).masked_fill(
        ~from_blocks(mask.expand(-1, heads, -1, -1)), float("-inf")
    )
    c = -(-length // stride)  # positions per column

    def to_columns(x: Tensor) -> Tensor:
        """(batch, h, length, e) -> (batch, h, s, c, e): column r holds r, r + s, r + 2s, ..."""
        return F.pad(x, (0, 0, 0, c * stride - length)).unflatten(2, (c, stride)).transpose(2, 3)

    def from_columns(x: Tensor) -> Tensor:
        return x.transpose(2, 3).flatten(2, 3)[:, :, :length]

    # Query b and key a of column r stand at b s + r and a s + r, (b - a) s apart; keys
    # inside the window were counted above.
    rows = torch.arange(c, device=q.device)
    apart = (rows[:, None] - rows[None, :]) * stride
    beyond = apart >= w if causal else apart.abs() >= w
    column_key_at = rows * stride + torch.arange(stride, device=q.device)[:, None]  # (s, c)
    column_mask = beyond & (column_key_at < length)[:, None, :]  # (s, queries, keys)
    if key_mask is not None:
        real = to_columns(key_mask.bool()[:, None, :, None]).squeeze(-1)  # (batch, 1, s, c)
        column_mask = column_mask & real[..., None, :]
    on_stride = (to_columns(q) @ to_columns(k).transpose(-2, -1)).masked_fill(
        ~column_mask, float("-inf")
    )
    # One softmax over both sets of keys.
    probs = torch.cat((in_window, from_columns(on_stride)), -1).div(math.sqrt(d_k)).softmax(-1)
    probs = F.dropout(probs, dropout_p) if dropout_p > 0 else probs
    p_window, p_stride = probs.split((keys.shape[2], c), -1)
    return from_blocks(to_blocks(p_window) @ values) + from_columns(
        to_columns(p_stride) @ to_columns(v)
    )


def padding_mask(key_mask: Tensor) -> Tensor:
    """(batch, keys) True-for-real-token mask -> (batch, 1, 1, keys) attention mask."""
    return key_mask[:, None, None, :]


def self_attention_mask(key_mask: Tensor | None, q_len: int, causal: bool) -> Tensor | None:
    """The combined mask of a self-attention layer, or None when nothing is masked.

    A padding query still attends to itself, so no row of the mask is empty:
    an empty row would make softmax produce NaN, and NaN in a padding position
    spreads into real positions through the backward pass. What a padding
    query computes is never read by a real one, because its key is masked.
    """
    if key_mask is None:
        return causal_mask(q_len, q_len) if causal else None
    k_len = key_mask.shape[-1]
    mask = padding_mask(key_mask)
    if causal:
        mask = mask & causal_mask(q_len, k_len, key_mask.device)
    # The queries are the last q_len keys; this band marks each one's own key.
    offset = k_len - q_len
    own = torch.ones(q_len, k_len, dtype=torch.bool, device=key_mask.device)
    return mask | own.tril(offset).triu(offset)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    bias: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """softmax(Q K^T / sqrt(d_k) + M + bias) V on (batch, heads, length, d_k) tensors.

    `k` and `v` may have fewer heads than `q` (grouped-query attention); each
    key/value head then serves n_heads / n_kv_heads query heads.

    With `need_weights` the plain reference path runs and also returns the
    attention weights (batch, heads, queries, keys). Otherwise the fused
    `F.scaled_dot_product_attention` runs and the weights are None; both paths
    compute the same function (tested).
    """
    if is_causal and mask is None and q.shape[-2] != k.shape[-2]:
        # SDPA aligns its causal mask top-left; with a cache it must be bottom-right,
        # where one query (the last position) sees every key.
        if q.shape[-2] > 1:
            mask = causal_mask(q.shape[-2], k.shape[-2], q.device)
        is_causal = False
    group = q.shape[1] // k.shape[1]
    if not need_weights:
        attn_mask = mask
        if bias is not None:
            # Under autocast the queries may be half precision; SDPA wants the bias alike.
            bias = bias.to(q.dtype)
            attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal and attn_mask is None,
            enable_gqa=group > 1,
        )
        return out, None
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    if is_causal:
        mask = causal_mask(q.shape[-2], k.shape[-2], q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    out = F.dropout(weights, dropout_p) @ v if dropout_p > 0 else weights @ v
    return out, weights


class MultiHeadAttention(nn.Module):
    """Multi-head attention with `n_kv_heads` key/value heads (MHA, GQA or MQA).

    Self-attention projects Q, K and V with one fused matrix (one matmul
    instead of three); cross-attention projects Q from the decoder and K, V
    (fused) from the encoder memory. With n_kv_heads == n_heads the layer has
    4 d_model^2 weights whatever the number of heads: splitting into heads
    only reshapes the projections (section 3.2.2).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        cross: bool = False,
        bias: bool = True,
        dropout: float = 0.0,
        rotary: Rotary | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model % n_heads or n_heads % n_kv_heads:
            raise AttnkitError(
                f"d_model {d_model} must be divisible by n_heads {n_heads}, "
                f"and n_heads by n_kv_heads {n_kv_heads}"
            )
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.d_head = d_model // n_heads
        self.cross = cross
        self.dropout = dropout
        self.rotary = rotary
        q_dim, kv_dim = n_heads * self.d_head, n_kv_heads * self.d_head
        if cross:
            self.q_proj = Linear(d_model, q_dim, bias=bias)
            self.kv_proj = Linear(d_model, 2 * kv_dim, bias=bias)
        else:
            self.qkv_proj = Linear(d_model, q_dim + 2 * kv_dim, bias=bias)
        self.out_proj = Linear(q_dim, d_model, bias=bias)

    def _heads(self, x: Tensor, n: int) -> Tensor:
        """(batch, length, n * d_head) -> (batch, n, length, d_head), a view."""
        return x.unflatten(-1, (n, self.d_head)).transpose(1, 2)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values (batch, kv_heads, source length, d_head) of `memory`."""
        k, v = self.kv_proj(memory).split(self.n_kv_heads * self.d_head, dim=-1)
        return self._heads(k, self.n_kv_heads), self._heads(v, self.n_kv_heads)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        bias: Tensor | None = None,
        positions: Tensor | None = None,
        need_weights: bool = False,
        cache: LayerKV | None = None,
        window: int = 0,
        stride: int = 0,
        key_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from `x` (batch, queries, d_model) to itself or to `memory`.

        `mask` is boolean and broadcastable to (batch, heads, queries, keys);
        `positions` (batch or 1, length) feed the rotary hook when there is one.
        A `window` (self-attention without a cache, with a `stride` or not)
        runs `local_attention` over the (batch, length) padding `key_mask`
        instead of a mask.
        With a `cache`, self-attention appends the new keys and values and
        attends over all cached ones; cross-attention reuses the cached memory
        keys and values.
        Returns the output (batch, queries, d_model) and, with `need_weights`,
        the attention weights (batch, heads, queries, keys).
        """
        q_dim = self.n_heads * self.d_head
        kv_dim = self.n_kv_heads * self.d_head
        if self.cross:
            q = self._heads(self.q_proj(x), self.n_heads)
            cached = None if cache is None else cache.memory()
            if cached is not None:
                k, v = cached
            elif memory is None:
                raise AttnkitError("cross-attention needs the encoder memory")
            else:
                k, v = self.memory_kv(memory)
        else:
            q, k, v = self.qkv_proj(x).split((q_dim, kv_dim, kv_dim), dim=-1)
            q = self._heads(q, self.n_heads)
            k, v = self._heads(k, self.n_kv_heads), self._heads(v, self.n_kv_heads)
            if self.rotary is not None:
                if positions is None:
                    positions = torch.arange(q.shape[-2], device=q.device)[None]
                q, k = self.rotary(q, k, positions, positions)
            if cache is not None:
                k, v = cache.update(k, v)
        dropout_p = self.dropout if self.training else 0.0
        if window:
            out = local_attention(
                q, k, v, window, stride, causal=is_causal, key_mask=key_mask, dropout_p=dropout_p
            )
            return self.out_proj(out.transpose(1, 2).flatten(2)), None
        # Beams of one sentence share its cached memory (`KVCache.group`): their queries
        # attend together, as more query positions over one copy of the keys and values.
        group = q.shape[0] // k.shape[0]
        if group > 1:
            q = q.unflatten(0, (-1, group)).transpose(1, 2).flatten(2, 3)
        out, weights = scaled_dot_product_attention(
            q,
            k,
            v,
            mask,
            bias=bias,
            is_causal=is_causal,
            dropout_p=dropout_p,
            need_weights=need_weights,
        )
        if group > 1:
            out = out.unflatten(2, (group, -1)).transpose(1, 2).flatten(0, 1)
            if weights is not None:
                weights = weights.unflatten(2, (group, -1)).transpose(1, 2).flatten(0, 1)
        return self.out_proj(out.transpose(1, 2).flatten(2)), weights
