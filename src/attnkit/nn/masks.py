"""Attention masks: which keys each query may look at.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + M) V                 (eq. 1)

M is 0 where a query may look at a key and -inf where it may not. Masks here
are boolean tensors broadcastable to (batch, heads, queries, keys) with True
where attention is allowed, the convention of `F.scaled_dot_product_attention`.

A decoder is causal: query i sees keys j <= i (section 3.2.3). Padding keys
are never seen. Local and sparse attention are masks too: a sliding window
lets query i see key j only when |i - j| < w (Mistral, Longformer); the
strided pattern of the Sparse Transformer (Child et al. 2019) adds the keys a
multiple of the stride away, so that two layers connect any two positions.
"""

from __future__ import annotations

import torch
from torch import Tensor


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
