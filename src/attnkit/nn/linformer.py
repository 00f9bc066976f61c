"""Linformer (Wang et al. 2020): self-attention in O(n k) time and memory, not O(n^2).

The context matrix softmax(Q K^T / sqrt(d_k)) is n x n but close to low rank, so
Linformer first projects the keys and the values along the sequence, from n rows
to k, with two learned matrices E, F in R^{k x n}:

    head_i = softmax(Q W_i^Q (E K W_i^K)^T / sqrt(d_k)) (F V W_i^V)           (eq. 7)

Each of the n queries then scores k projected keys, whatever n is. A projected
key mixes every position, so a query would read the future through it: Linformer
is for an encoder's (bidirectional) self-attention only, and `ModelConfig` refuses
it for a decoder.

The projections are sized for `max_len`; a shorter sequence uses the first n
columns of E and F, which is the longer sequence zero-padded. Padding keys and
values are zeroed before the projection for the same reason, so a sequence's
output does not depend on the padding beside it in a batch.

Sharing (the paper's section 4): `headwise`, one E and one F a layer for all its
heads; `key-value`, one matrix a layer for both (E = F); `layerwise`, one matrix
for keys and values of every layer (the stack builds it once and hands it to
each layer).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.errors import AttnkitError
from attnkit.nn.attention import (
    NO_INPUTS,
    AttentionInputs,
    AttentionPath,
    MultiHeadAttention,
    scaled_dot_product_attention,
)
from attnkit.nn.kv_cache import LayerKV


class LinformerProjection(nn.Module):
    """E (and F, unless one matrix serves both) in R^{k x max_len}."""

    def __init__(self, k: int, max_len: int, shared_kv: bool = False) -> None:
        super().__init__()
        # Xavier's scale keeps a projected row about as large as a key, whatever n is.
        self.e = nn.Parameter(nn.init.xavier_uniform_(torch.empty(k, max_len)))
        self.f = (
            None if shared_kv else nn.Parameter(nn.init.xavier_uniform_(torch.empty(k, max_len)))
        )

    def forward(self, k: Tensor, v: Tensor, key_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """Keys and values (batch, heads, n, d_head) -> E K and F V (batch, heads, k, d_head);
        `key_mask` (batch, n) is True for real tokens (None: all real)."""
        n = k.shape[2]
        if n > self.e.shape[1]:
            raise AttnkitError(
                f"Linformer's projections cover {self.e.shape[1]} positions and the sequence "
                f"has {n}; build the model with a larger max_len"
            )
        if key_mask is not None:
            real = key_mask[:, None, :, None].to(k.dtype)
            k, v = k * real, v * real
        e = self.e[:, :n].to(k.dtype)
        f = e if self.f is None else self.f[:, :n].to(v.dtype)
        return e @ k, f @ v


class LinformerAttention(MultiHeadAttention):
    """Self-attention over keys and values projected to k rows (`LinformerProjection`).

    `projection` is this layer's own, or the one a stack shares among its layers.
    """

    def __init__(
        self, d_model: int, n_heads: int, projection: LinformerProjection, **options
    ) -> None:
        super().__init__(d_model, n_heads, **options)
        if self.cross or self.rotary is not None:
            raise AttnkitError("Linformer is self-attention without rotary positions")
        self.projection = projection

    def forward(
        self,
        x: Tensor,
        inputs: AttentionInputs = NO_INPUTS,
        cache: LayerKV | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x (batch, n, d_model) -> (batch, n, d_model), and on the weights path the weights
        (batch, heads, n, k) over the projected keys."""
        if cache is not None or inputs.causal:
            raise AttnkitError(
                "Linformer attention is an encoder's: it has no causal form and no cache"
            )
        q_dim, kv_dim = self.n_heads * self.d_head, self.n_kv_heads * self.d_head
        q, k, v = self.qkv_proj(x).split((q_dim, kv_dim, kv_dim), dim=-1)
        q = self.scaled(self._heads(q, self.n_heads))
        k, v = self.projection(
            self._heads(k, self.n_kv_heads), self._heads(v, self.n_kv_heads), inputs.key_mask
        )
        out, weights = scaled_dot_product_attention(
            q,
            k,
            v,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights or inputs.path is AttentionPath.WEIGHTS,
            backend=self.backend,
        )
        return self.out_proj(out.transpose(1, 2).flatten(2)), weights
