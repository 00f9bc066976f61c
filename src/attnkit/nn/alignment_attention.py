"""Cross-attention whose alignment at each target step depends on the alignment before it.

Plain cross-attention scores every target position against the source on its
own, so all positions are computed at once. Location-aware attention
(`location_attention.py`) and monotonic attention (`monotonic_attention.py`)
read the previous step's alignment alpha_{i-1} (batch, heads, source) to make
alpha_i, so under teacher forcing the queries still come all at once (the
decoder's self-attention gives them), but the alignments are made one step after
another, a short loop over the target length; the values are then read at once:

    alpha_i = Align(q_i, K, alpha_{i-1}),     context_i = alpha_i V

When decoding, each step's alignment (or what the kind keeps of it) is carried
from one step to the next in the decode's `AlignmentState` (`alignment_state.py`,
handed down in `AttentionInputs.alignment`), which follows the beams when beam
search reorders them.

This module is the plumbing both kinds share: each beam and head its own keys and
values (the queries, the memory and its mask are `MultiHeadAttention.cross_qkv`'s),
the source's real tokens, the state carried between steps. A kind says how it
starts (`initial_state`) and how it aligns (`align`).
"""

from __future__ import annotations

from abc import abstractmethod

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.errors import AttnkitError
from attnkit.nn.attention import NO_INPUTS, AttentionInputs, AttentionPath, MultiHeadAttention
from attnkit.nn.kv_cache import LayerKV


class AlignmentAttention(MultiHeadAttention):
    """Cross-attention that aligns step by step; a subclass gives `initial_state` and `align`."""

    def __init__(
        self, d_model: int, n_heads: int, n_kv_heads: int | None = None, **options
    ) -> None:
        super().__init__(d_model, n_heads, n_kv_heads, cross=True, **options)

    @abstractmethod
    def initial_state(self, real: Tensor, decoding: bool) -> Tensor:
        """What the first step reads for the previous alignment, given `real` (batch, source
        length), True for real source tokens; `decoding` says which form the state takes."""

    @abstractmethod
    def align(
        self, x: Tensor, q: Tensor, k: Tensor, real: Tensor, state: Tensor, decoding: bool
    ) -> tuple[Tensor, Tensor]:
        """Alignments (batch, heads, queries, source length) of queries q (batch, heads,
        queries, d_head) over keys k (batch, heads, source length, d_head), the queries in
        order from `state`, and the state after the last query; x (batch, queries, d_model)
        is what the queries were projected from."""

    def forward(
        self,
        x: Tensor,
        inputs: AttentionInputs = NO_INPUTS,
        cache: LayerKV | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from x (batch, queries, d_model) to the memory of `inputs` or of the cache;
        returns the output and, when asked, the alignments (batch, heads, queries, source)."""
        q, k, v, mask, group = self.cross_qkv(x, inputs, cache)
        # Each beam and each query head gets its own view of the keys and values it reads.
        heads = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(group, 0).repeat_interleave(heads, 1)
        v = v.repeat_interleave(group, 0).repeat_interleave(heads, 1)
        if mask is None:
            real = torch.ones(q.shape[0], k.shape[2], dtype=torch.bool, device=q.device)
        else:  # the memory's mask is one a sentence, a monotonic window's one a row
            real = mask[:, 0, 0]
            real = real if real.shape[0] == q.shape[0] else real.repeat_interleave(group, 0)
        decoding = cache is not None
        carried = inputs.alignment
        if decoding and carried is None:
            raise AttnkitError(
                "location-aware and monotonic attention carry each step's alignment to the next, "
                "so decode on the state that the model's new_cache makes (DecodingState)"
            )
        state = carried.get(cache.index) if decoding else None
        if state is None:
            state = self.initial_state(real, decoding)
        weights, state = self.align(x, q, k, real, state, decoding)
        if decoding:
            carried.keep(cache.index, state)
        dropout_p = self.dropout if self.training else 0.0
        out = F.dropout(weights, dropout_p) @ v if dropout_p else weights @ v
        asked = need_weights or inputs.path is AttentionPath.WEIGHTS
        return self.out_proj(out.transpose(1, 2).flatten(2)), weights if asked else None

    def scores(self, q: Tensor, k: Tensor, real: Tensor) -> Tensor:
        """Q K^T / sqrt(d_k) (batch, heads, queries, source), -inf over source padding."""
        scores = q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5
        return scores.masked_fill(~real[:, None, None], float("-inf"))


def first_real(real: Tensor, heads: int, dtype: torch.dtype) -> Tensor:
    """(batch, heads, source) one-hot at each row's first real source token: where an
    alignment starts, the source's beginning."""
    start = F.one_hot(real.long().argmax(-1), real.shape[-1]).to(dtype)
    return start[:, None].expand(-1, heads, -1)
