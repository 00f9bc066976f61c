"""Scaled dot-product attention (eq. 1), and the one place that chooses how a call runs.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + M + bias) V

One function, five ways to compute it, each the faster somewhere or the only
one that gives something (measured where the choice is made):

    BLOCKWISE  a long local window block by block, without a mask (`local_attention.py`)
    STEP       a decoding step in one C call, over the cache as it lies (`kernels/step_attention`)
    FUSED      torch's `F.scaled_dot_product_attention`, on the kernel `backend` names
    PRODUCTS   the plain products, softmax and all: faster than torch's CPU flash kernel
               for many rows of few queries (a decoding step of a large batch or beam)
    WEIGHTS    the plain products, returning the attention weights too

`Kernel.choose` is the only place that picks one; `MultiHeadAttention` asks it
once a call, and `scaled_dot_product_attention` (the function alone) too. All
five compute the same function, zeros for a query that may see no key
included (tested).
"""

from __future__ import annotations

import enum
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.kernels import step_attention
from attnkit.nn.masks import causal_mask
from attnkit.nn.sdpa_backend import fused_attention


class Kernel(enum.Enum):
    """How one attention call is computed (see the module docstring)."""

    BLOCKWISE = "blockwise"
    STEP = "step"
    FUSED = "fused"
    PRODUCTS = "products"
    WEIGHTS = "weights"

    @classmethod
    def choose(
        cls,
        q: Tensor,
        k: Tensor,
        mask: Tensor | None = None,
        *,
        weights: bool = False,
        blockwise: bool = False,
        step: bool = False,
        dropout_p: float = 0.0,
        backend: str = "auto",
    ) -> Kernel:
        """The way to attend from `q` (batch, heads, queries, d_k) to `k` under `mask`.

        weights: the weights are wanted; blockwise: the stack chose to run its long
        window block by block (`AttentionPath.BLOCKWISE`, which builds no mask);
        step: a decoding step on a cache, where every query sees every key it holds.
        """
        if blockwise:
            return cls.BLOCKWISE
        if weights:
            return cls.WEIGHTS
        if step and dropout_p == 0 and _one_mask_for_all_heads(mask) and step_attention.runs(q, k):
            return cls.STEP
        return cls.FUSED if _fused_pays(q, backend, dropout_p) else cls.PRODUCTS


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
    backend: str = "auto",
) -> tuple[Tensor, Tensor | None]:
    """softmax(Q K^T / sqrt(d_k) + M + bias) V on (batch, heads, length, d_k) tensors.

    `k` and `v` may have fewer heads than `q` (grouped-query attention); each
    key/value head then serves n_heads / n_kv_heads query heads.

    With `need_weights` the plain products run and also return the attention
    weights (batch, heads, queries, keys); without, the fused kernel or the
    plain products, as `Kernel.choose` picks, and the weights are None.
    """
    kernel = Kernel.choose(q, k, weights=need_weights, dropout_p=dropout_p, backend=backend)
    return computed(
        kernel, q, k, v, mask, bias=bias, is_causal=is_causal, dropout_p=dropout_p, backend=backend
    )


def computed(
    kernel: Kernel,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    bias: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    backend: str = "auto",
) -> tuple[Tensor, Tensor | None]:
    """`scaled_dot_product_attention` by `kernel`: FUSED, PRODUCTS or WEIGHTS (which alone
    returns the weights)."""
    if is_causal and mask is None and q.shape[-2] != k.shape[-2]:
        # SDPA aligns its causal mask top-left; with a cache it must be bottom-right,
        # where one query (the last position) sees every key.
        if q.shape[-2] > 1:
            mask = causal_mask(q.shape[-2], k.shape[-2], q.device)
        is_causal = False
    group = q.shape[1] // k.shape[1]
    if kernel is Kernel.FUSED:
        attn_mask = mask
        if bias is not None:
            # Under autocast the queries may be half precision; SDPA wants the bias alike.
            bias = bias.to(q.dtype)
            attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        out = fused_attention(
            q,
            k,
            v,
            backend,
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
    blind = _blind_queries(mask, bias)
    if blind is not None:
        # Softmax over a row of -inf alone is NaN, and NaN stays NaN through the backward
        # pass: such a row is given finite scores, and zeros as its weights.
        scores = scores.masked_fill(blind, 0.0)
    weights = scores.softmax(dim=-1)
    if blind is not None:
        weights = weights.masked_fill(blind, 0.0)
    out = F.dropout(weights, dropout_p) @ v if dropout_p > 0 else weights @ v
    return out, weights if kernel is Kernel.WEIGHTS else None


def _blind_queries(mask: Tensor | None, bias: Tensor | None) -> Tensor | None:
    """(..., queries, 1) True for a query that may see no key (a mask or a bias of -inf
    over its whole row), which gets zeros, as the fused kernel gives it; None when
    every query sees a key, the usual case, which is checked on the mask's and the
    bias's own shapes, not on the scores."""
    sees = mask
    if bias is not None:
        finite = ~torch.isneginf(bias)
        sees = finite if sees is None else sees & finite
    if sees is None:
        return None
    blind = ~sees.any(-1, keepdim=True)
    # Compiled (a static-cache decoding step), reading the check's value would end the graph,
    # so there the masking always runs; it gives the same weights either way.
    return blind if torch.compiler.is_compiling() or bool(blind.any()) else None


# A decoding step of many rows (sentences x beams x heads) with a few queries each: there the
# plain products beat torch's CPU flash kernel, whose fixed cost per (row, head) dominates
# (2 threads, 20 keys: 145 against 509 us for 32 x 8 rows of 4 queries; 265 against 455 us for
# 128 x 8 rows of one); at batch 1 flash stays faster (10 against 21 us).
FEW_QUERIES, MANY_ROWS = 4, 128


def _fused_pays(q: Tensor, backend: str, dropout_p: float) -> bool:
    """Whether the fused kernel runs (else the plain products, which compute the same)."""
    if backend != "auto" or q.device.type != "cpu" or dropout_p > 0 or torch.is_grad_enabled():
        return True
    # The shapes are read last: compiled, each read is a guard that can force a recompile.
    return not (q.shape[-2] <= FEW_QUERIES and q.shape[0] * q.shape[1] >= MANY_ROWS)


def _one_mask_for_all_heads(mask: Tensor | None) -> bool:
    """Whether `mask` is None or (batch or 1, 1, queries or 1, keys), as `step_attention`
    takes it: the same for every head."""
    return mask is None or (mask.dim() == 4 and mask.shape[1] == 1)
