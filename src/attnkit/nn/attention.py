"""Scaled dot-product attention and multi-head attention, with one context per forward pass.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + M) V                 (eq. 1)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)                      (section 3.2.2)

M is the mask (`masks.py`): 0 where a query may look at a key, -inf where it
may not. An additive float bias (ALiBi) and a rotation of queries and keys
(RoPE) plug in through `bias` and `rotary` without touching the rest.

What every layer of a stack reads in one forward pass (the masks, the bias,
the positions, the memory, its `AttentionPath`) is one `AttentionInputs`,
built once for all layers. The path is what the stack decides for all of them,
since it decides which masks to build: a long local window block by block, the
masked fused path, or the path that returns the attention weights. How each
call then computes eq. 1 (block by block, a decoding step in one C call,
torch's fused kernel, the plain products) is chosen in one place,
`Kernel.choose` (`scaled_dot_product.py`), which `MultiHeadAttention.forward`
asks once a call.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import Tensor, nn

from attnkit.errors import AttnkitError
from attnkit.kernels import step_attention
from attnkit.nn.alignment_state import AlignmentState
from attnkit.nn.kv_cache import HeldKV, LayerKV
from attnkit.nn.linear import Linear
from attnkit.nn.local_attention import local_attention
from attnkit.nn.scaled_dot_product import Kernel, computed
from attnkit.nn.scaled_dot_product import (  # eq. 1's old import path, from here
    scaled_dot_product_attention as scaled_dot_product_attention,
)
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
    `key_mask` and `window`; cross-attention reads `memory`, `memory_mask`,
    `memory_window` and `alignment`, and of `path` only whether the weights are
    wanted (`AttentionPath.WEIGHTS`).

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
    memory_window: (batch, 1, 1, source length) the source keys each row's
        cross-attention may see at this decoding step (a monotonic window,
        `nn/monotonic.py`, real tokens only), in place of `memory_mask`; one row
        per row of the batch even where rows share a memory row. None: no window.
    alignment: when decoding, what location-aware and monotonic cross-attention
        carry from step to step, each layer its own (`AlignmentState`); None
        for a model without them, and in a teacher-forced pass.
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
    memory_window: Tensor | None = None
    alignment: AlignmentState | None = None


class CrossQKV(NamedTuple):
    """Cross-attention's operands (`MultiHeadAttention.cross_qkv`).

    q: (batch, heads, queries, d_head); k, v: (batch / group, kv_heads, source, d_head);
    mask: over the memory, the padding mask (batch / group, 1, 1, source) or a monotonic
    window (batch, 1, 1, source), or None; group: rows of the batch per memory row (the
    beams of a sentence, `KVCache.group`).
    """

    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor | None
    group: int


# Every key, nothing masked, the fused path: what a layer called on its own reads. Frozen,
# so every layer may share it.
NO_INPUTS = AttentionInputs()


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
        cross-attention reuses the cached memory keys and values, within
        `inputs.memory_window` when a decode has a monotonic window.
        Returns the output (batch, queries, d_model) and, on the weights path,
        the attention weights (batch, heads, queries, keys).
        """
        if self.cross:
            q, k, v, mask, group = self.cross_qkv(x, inputs, cache)
            rows, bias, is_causal = None, None, False
        else:
            q, k, v, rows = self._self_qkv(x, inputs, cache)
            mask, bias, group = inputs.mask, inputs.bias, 1
            is_causal = inputs.causal and mask is None and bias is None
        # The beams of one sentence attend together, as more query positions over one copy
        # of their memory's keys and values.
        if group > 1:
            if inputs.memory_window is not None:  # each row's own window goes with its queries
                mask = _group_rows(mask.expand(-1, -1, q.shape[2], -1), group)
            q = _group_rows(q, group)
        dropout_p = self.dropout if self.training else 0.0
        kernel = Kernel.choose(
            q,
            k,
            mask,
            weights=need_weights or inputs.path is AttentionPath.WEIGHTS,
            blockwise=not self.cross and inputs.path is AttentionPath.BLOCKWISE,
            step=cache is not None and (self.cross or q.shape[2] == 1),
            dropout_p=dropout_p,
            backend=self.backend,
        )
        if kernel is Kernel.STEP:  # over the cache as it lies, rows and all
            out = step_attention.attend(q, k, v, rows, mask, bias)
            return self.out_proj(out.view(x.shape[0], x.shape[1], -1)), None
        k, v = HeldKV(k, v, rows).gathered()
        weights = None
        if kernel is Kernel.BLOCKWISE:
            window = inputs.window
            out = local_attention(
                q, k, v, window.size, window.stride, causal=inputs.causal,
                key_mask=inputs.key_mask, dropout_p=dropout_p, backend=self.backend,
            )  # fmt: skip
        else:
            out, weights = computed(
                kernel, q, k, v, mask, bias=bias, is_causal=is_causal, dropout_p=dropout_p,
                backend=self.backend,
            )  # fmt: skip
        if group > 1:
            out = out.unflatten(2, (group, -1)).transpose(1, 2).flatten(0, 1)
            if weights is not None:
                weights = weights.unflatten(2, (group, -1)).transpose(1, 2).flatten(0, 1)
        return self.out_proj(out.transpose(1, 2).flatten(2)), weights

    def cross_qkv(self, x: Tensor, inputs: AttentionInputs, cache: LayerKV | None) -> CrossQKV:
        """What cross-attention from `x` reads: queries, the memory's keys and values (from the
        cache, or projected from `inputs.memory`), its mask, and the rows per memory row."""
        q = self.scaled(self._heads(self.q_proj(x), self.n_heads))
        cached = None if cache is None else cache.memory()
        if cached is not None:
            k, v = cached
        elif inputs.memory is None:
            raise AttnkitError("cross-attention needs the encoder memory")
        else:
            k, v = self.memory_kv(inputs.memory)
        # A monotonic window replaces the memory's padding mask, which it includes, by one of
        # each row's own.
        window = inputs.memory_window
        mask = inputs.memory_mask if window is None else window
        # Beams of one sentence share its cached memory (`KVCache.group`).
        return CrossQKV(q, k, v, mask, q.shape[0] // k.shape[0])

    def _self_qkv(
        self, x: Tensor, inputs: AttentionInputs, cache: LayerKV | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Queries, keys and values from `x`, turned by position (RoPE); with a cache, the keys
        and values of every position so far, and after a beam search reorder the table of
        where each row's keys lie (`HeldKV.rows`)."""
        q_dim, kv_dim = self.n_heads * self.d_head, self.n_kv_heads * self.d_head
        q, k, v = self.qkv_proj(x).split((q_dim, kv_dim, kv_dim), dim=-1)
        q = self.scaled(self._heads(q, self.n_heads))
        k, v = self._heads(k, self.n_kv_heads), self._heads(v, self.n_kv_heads)
        if self.rotary is not None:
            positions = inputs.positions
            if positions is None:
                positions = torch.arange(q.shape[-2], device=q.device)[None]
            q, k = self.rotary(q, k, positions, positions)
        if cache is None:
            return q, k, v, None
        return q, *cache.update(k, v)


def _group_rows(x: Tensor, group: int) -> Tensor:
    """(batch, heads, queries, ...) -> (batch / group, heads, group * queries, ...): the rows of
    one shared memory row side by side as more queries, row-major."""
    return x.unflatten(0, (-1, group)).transpose(1, 2).flatten(2, 3)
