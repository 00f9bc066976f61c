"""Scaled dot-product attention and multi-head attention, with one context per forward pass.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + M) V                 (eq. 1)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)                      (section 3.2.2)

M is the mask (`masks.py`): 0 where a query may look at a key, -inf where it
may not. An additive float bias (ALiBi) and a rotation of queries and keys
(RoPE) plug in through `bias` and `rotary` without touching the rest.

What every layer of a stack reads in one forward pass (the masks, the bias,
the positions, the memory, which way attention runs) is one `AttentionInputs`,
built once for all layers. Attention runs one of three ways, its
`AttentionPath`, chosen in one place (`AttentionPath.choose`): a long local
window block by block (`local_attention.py`), the fused
`F.scaled_dot_product_attention`, or the reference path that also returns
the attention weights.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.errors import AttnkitError
from attnkit.kernels import step_attention
from attnkit.nn.kv_cache import HeldKV, LayerKV
from attnkit.nn.linear import Linear
from attnkit.nn.local_attention import local_attention
from attnkit.nn.masks import causal_mask
from attnkit.nn.sdpa_backend import fused_attention
from attnkit.nn.window import NO_WINDOW, Window


class Rotary(Protocol):
    """Rotates queries and keys by their positions before the dot product (RoPE)."""

    def __call__(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> tuple[Tensor, Tensor]: ...


class AttentionPath(enum.Enum):
    """How self-attention runs; cross-attention runs fused unless the weights are wanted."""

    BLOCKWISE = "blockwise"  # `local_attention`: a long window block by block, with no mask
    FUSED = "fused"  # `F.scaled_dot_product_attention` with the mask or the bias
    WEIGHTS = "weights"  # the reference path, which also returns the attention weights

    @classmethod
    def choose(
        cls, length: int, window: Window, *, need_weights: bool, cached: bool, alibi: bool
    ) -> AttentionPath:
        """The path of `length` queries under `window`.

        Only the masked paths give the weights. The blocks need as many queries
        as keys, in position order, so a cache (new queries over the held keys,
        perhaps a ring) takes the mask too, as does ALiBi, a bias over every score.
        """
        if need_weights:
            return cls.WEIGHTS
        if not cached and not alibi and window.runs_blockwise(length):
            return cls.BLOCKWISE
        return cls.FUSED


@dataclass(frozen=True, slots=True)
class AttentionInputs:
    """What each attention layer of a stack reads in one forward pass, shared by all layers.

    Self-attention reads `path`, `causal`, `mask`, `bias`, `positions`,
    `key_mask` and `window`; cross-attention reads `memory` and `memory_mask`,
    and of `path` only whether the weights are wanted (`AttentionPath.WEIGHTS`).

    path: how self-attention runs (`AttentionPath.choose`).
    causal: whether a query may not see later keys; when `mask` and `bias`
        are None that is all that is masked.
    mask: the self-attention mask, boolean, broadcastable to (batch, heads,
        queries, keys); None when only causality (if causal) masks, and on
        the blockwise path.
    bias: added to the self-attention scores (ALiBi), the mask folded in as -inf.
    positions: (batch or 1, length) the queries' positions, for RoPE
        (None: 0, 1, 2, ...).
    key_mask: (batch, length), True for real tokens: the padding of the
        blockwise path, also kept out of a mixture of experts' load-balancing
        loss. None when nothing is padded, and when decoding on a cache.
    window: the local window of the blockwise path.
    memory: (batch, source length, d_model) the encoder output that
        cross-attention reads; None when the cache holds its keys and values.
    memory_mask: (batch, 1, 1, source length) over the memory, or None.
    """

    path: AttentionPath = AttentionPath.FUSED
    causal: bool = False
    mask: Tensor | None = None
    bias: Tensor | None = None
    positions: Tensor | None = None
    key_mask: Tensor | None = None
    window: Window = NO_WINDOW
    memory: Tensor | None = None
    memory_mask: Tensor | None = None


# Every key, nothing masked, the fused path: what a layer called on its own reads. Frozen,
# so every layer may share it.
NO_INPUTS = AttentionInputs()


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

    With `need_weights` the plain reference path runs and also returns the
    attention weights (batch, heads, queries, keys); it also runs, returning no
    weights, for a CPU decoding step of many rows with few queries each, where
    it is the faster (`_fused_pays`). Otherwise the fused
    `F.scaled_dot_product_attention` runs, on the kernel `backend` names
    (`sdpa_backend.py`), and the weights are None. Both paths compute the same
    function, zeros for a query that may see no key included (tested).
    """
    if is_causal and mask is None and q.shape[-2] != k.shape[-2]:
        # SDPA aligns its causal mask top-left; with a cache it must be bottom-right,
        # where one query (the last position) sees every key.
        if q.shape[-2] > 1:
            mask = causal_mask(q.shape[-2], k.shape[-2], q.device)
        is_causal = False
    group = q.shape[1] // k.shape[1]
    if not need_weights and _fused_pays(q, backend, dropout_p):
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
    return out, weights if need_weights else None


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
    return blind if bool(blind.any()) else None


# A decoding step of many rows (sentences x beams x heads) with a few queries each: there the
# plain products beat torch's CPU flash kernel, whose fixed cost per (row, head) dominates
# (2 threads, 20 keys: 145 against 509 us for 32 x 8 rows of 4 queries; 265 against 455 us for
# 128 x 8 rows of one); at batch 1 flash stays faster (10 against 21 us).
FEW_QUERIES, MANY_ROWS = 4, 128


def _fused_pays(q: Tensor, backend: str, dropout_p: float) -> bool:
    """Whether the fused kernel runs (else the plain products, which compute the same)."""
    few_queries_many_rows = q.shape[-2] <= FEW_QUERIES and q.shape[0] * q.shape[1] >= MANY_ROWS
    plain = backend == "auto" and q.device.type == "cpu" and dropout_p == 0
    return not (plain and few_queries_many_rows and not torch.is_grad_enabled())


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
        backend: str = "auto",
        d_head: int | None = None,
        scale_scores: bool = True,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if (d_head is None and d_model % n_heads) or n_heads % n_kv_heads:
            raise AttnkitError(
                f"d_model {d_model} must be divisible by n_heads {n_heads} (or d_head given), "
                f"and n_heads by n_kv_heads {n_kv_heads}"
            )
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.d_head = d_model // n_heads if d_head is None else d_head
        # T5 scores Q K^T unscaled: queries times sqrt(d_k) cancel the 1/sqrt(d_k) of every path.
        self.query_scale = None if scale_scores else math.sqrt(self.d_head)
        self.cross = cross
        self.dropout = dropout
        self.rotary = rotary
        self.backend = backend  # the fused kernel (`sdpa_backend.BACKENDS`)
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

    def scaled(self, q: Tensor) -> Tensor:
        """The queries, times sqrt(d_k) when scores are not to be scaled (`scale_scores`)."""
        return q if self.query_scale is None else q * self.query_scale

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values (batch, kv_heads, source length, d_head) of `memory`."""
        k, v = self.kv_proj(memory).split(self.n_kv_heads * self.d_head, dim=-1)
        return self._heads(k, self.n_kv_heads), self._heads(v, self.n_kv_heads)

    def forward(
        self,
        x: Tensor,
        inputs: AttentionInputs = NO_INPUTS,
        cache: LayerKV | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from `x` (batch, queries, d_model) to itself or to the memory of `inputs`.

        Without `inputs`, self-attention attends to every key, unmasked. The
        weights come back on the weights path of `inputs`, and from a
        cross-attention also when this layer alone is asked (`need_weights`:
        the copy attention of a pointer-generator, the guided-attention loss).

        With a `cache` (this layer's part of a `KVCache`), self-attention
        appends the new keys and values and attends over all cached ones;
        cross-attention reuses the cached memory keys and values, within the
        cache's monotonic window if it has one, and the last layer's
        cross-attention then moves the window's focus (`KVCache.move_focus`).
        Returns the output (batch, queries, d_model) and, on the weights path,
        the attention weights (batch, heads, queries, keys).
        """
        q_dim = self.n_heads * self.d_head
        kv_dim = self.n_kv_heads * self.d_head
        dropout_p = self.dropout if self.training else 0.0
        rows = None  # after a beam search reorder, where each row's keys lie (`HeldKV`)
        if self.cross:
            q = self.scaled(self._heads(self.q_proj(x), self.n_heads))
            cached = None if cache is None else cache.memory()
            if cached is not None:
                k, v = cached
            elif inputs.memory is None:
                raise AttnkitError("cross-attention needs the encoder memory")
            else:
                k, v = self.memory_kv(inputs.memory)
            mask, bias, is_causal = inputs.memory_mask, None, False
            # A monotonic window (`KVCache.set_monotonic`) replaces the memory's padding mask,
            # which it includes, by one of each row's own.
            window = None if cache is None else cache.memory_window()
            mask = mask if window is None else window
            moves_focus = cache is not None and cache.moves_focus
        else:
            q, k, v = self.qkv_proj(x).split((q_dim, kv_dim, kv_dim), dim=-1)
            q = self.scaled(self._heads(q, self.n_heads))
            k, v = self._heads(k, self.n_kv_heads), self._heads(v, self.n_kv_heads)
            if self.rotary is not None:
                positions = inputs.positions
                if positions is None:
                    positions = torch.arange(q.shape[-2], device=q.device)[None]
                q, k = self.rotary(q, k, positions, positions)
            if cache is not None:
                k, v, rows = cache.update(k, v)
            if inputs.path is AttentionPath.BLOCKWISE:
                k, v = HeldKV(k, v, rows).gathered()
                window = inputs.window
                out = local_attention(
                    q,
                    k,
                    v,
                    window.size,
                    window.stride,
                    causal=inputs.causal,
                    key_mask=inputs.key_mask,
                    dropout_p=dropout_p,
                    backend=self.backend,
                )
                return self.out_proj(out.transpose(1, 2).flatten(2)), None
            mask, bias = inputs.mask, inputs.bias
            is_causal = inputs.causal and mask is None and bias is None
            window, moves_focus = None, False
        # Beams of one sentence share its cached memory (`KVCache.group`): their queries
        # attend together, as more query positions over one copy of the keys and values.
        group = q.shape[0] // k.shape[0] if self.cross else 1
        if group > 1:
            if window is not None:  # each row's own window goes with its queries
                mask = _group_rows(window.expand(-1, -1, q.shape[2], -1), group)
            q = _group_rows(q, group)
        weights_asked = need_weights or moves_focus or inputs.path is AttentionPath.WEIGHTS
        # A decoding step (every query sees every key) in one C call, over the cache as it lies.
        step = cache is not None and (self.cross or q.shape[2] == 1) and not weights_asked
        if step and dropout_p == 0 and _one_mask_for_all_heads(mask) and step_attention.runs(q, k):
            out = step_attention.attend(q, k, v, rows, mask, bias)
            return self.out_proj(out.view(x.shape[0], x.shape[1], -1)), None
        if rows is not None:
            k, v = HeldKV(k, v, rows).gathered()
        out, weights = scaled_dot_product_attention(
            q,
            k,
            v,
            mask,
            bias=bias,
            is_causal=is_causal,
            dropout_p=dropout_p,
            need_weights=weights_asked,
            backend=self.backend,
        )
        if group > 1:
            out = out.unflatten(2, (group, -1)).transpose(1, 2).flatten(0, 1)
            if weights is not None:
                weights = weights.unflatten(2, (group, -1)).transpose(1, 2).flatten(0, 1)
        if moves_focus:
            cache.move_focus(weights)
        return self.out_proj(out.transpose(1, 2).flatten(2)), weights


def _one_mask_for_all_heads(mask: Tensor | None) -> bool:
    """Whether `mask` is None or (batch or 1, 1, queries or 1, keys), as `step_attention`
    takes it: the same for every head."""
    return mask is None or (mask.dim() == 4 and mask.shape[1] == 1)


def _group_rows(x: Tensor, group: int) -> Tensor:
    """(batch, heads, queries, ...) -> (batch / group, heads, group * queries, ...): the rows of
    one shared memory row side by side as more queries, row-major."""
    return x.unflatten(0, (-1, group)).transpose(1, 2).flatten(2, 3)
