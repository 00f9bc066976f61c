"""Local attention: a sliding window of keys (plus strided keys), computed block by block.

A query i sees the keys j with |i - j| < w (i - j < w when causal: Mistral,
Longformer), and, with a stride s, those with i - j a multiple of s (the
strided pattern of the Sparse Transformer, Child et al. 2019); `local_mask`
is that mask. A mask only removes scores, so its cost stays that of full
attention. A window over a sequence longer than two windows (and than
`BLOCKWISE_MIN_LENGTH`) is computed block by block instead
(`local_attention`): each block of w queries reads only its own and the
neighbouring blocks of keys, O(length x w) rather than O(length^2); the
strided keys, taken column by column, add O(length^2 / s). When a sequence
runs block by block is `Window`'s decision (`window.py`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.nn.masks import local_mask
from attnkit.nn.sdpa_backend import fused_attention


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
    backend: str = "auto",
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
        out = fused_attention(  # on the kernel `backend` names (`sdpa_backend.py`)
            to_blocks(q),
            neighbours(k),
            neighbours(v),
            backend,
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
