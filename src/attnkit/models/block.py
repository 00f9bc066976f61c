"""One Transformer layer (section 3.1, figure 1).

An encoder layer is self-attention then the feed-forward network; a decoder
layer puts cross-attention over the encoder output (the "memory") between
the two, and masks its self-attention causally so position i sees only
positions <= i. Each sub-layer sits in a residual connection with its norm.
"""

from __future__ import annotations

from torch import Tensor, nn

from attnkit.config import ModelConfig
from attnkit.nn import FeedForward, MultiHeadAttention, Residual, make_norm
from attnkit.nn.kv_cache import LayerKV

Weights = tuple[Tensor | None, Tensor | None]


class Block(nn.Module):
    def __init__(self, config: ModelConfig, *, causal: bool, cross: bool) -> None:
        super().__init__()
        c = config
        self.causal = causal

        def residual() -> Residual:
            return Residual(
                make_norm(c.norm, c.d_model, c.norm_eps, c.bias), c.norm_position, c.dropout
            )

        def attention(is_cross: bool) -> MultiHeadAttention:
            return MultiHeadAttention(
                c.d_model,
                c.n_heads,
                c.n_kv_heads,
                cross=is_cross,
                bias=c.bias,
                dropout=c.attention_dropout,
            )

        self.self_attn, self.self_attn_residual = attention(False), residual()
        self.cross_attn = attention(True) if cross else None
        self.cross_attn_residual = residual() if cross else None
        self.ff = FeedForward(c.d_model, c.d_ff, c.activation, c.bias)
        self.ff_residual = residual()

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        positions: Tensor | None = None,
        need_weights: bool = False,
        cache: LayerKV | None = None,
    ) -> tuple[Tensor, Weights]:
        """x: (batch, length, d_model) -> same shape, plus (self, cross) attention weights.

        `mask` is the full self-attention mask (None: only causal, if causal);
        `memory_mask` is (batch, 1, 1, source length) over the memory; `cache`
        is this layer's part of a `KVCache` when decoding step by step.
        """
        r = self.self_attn_residual
        h, self_weights = self.self_attn(
            r.before(x),
            mask=mask,
            is_causal=self.causal and mask is None,
            positions=positions,
            need_weights=need_weights,
            cache=cache,
        )
        x = r.after(x, h)
        cross_weights = None
        if self.cross_attn is not None:
            r = self.cross_attn_residual
            h, cross_weights = self.cross_attn(
                r.before(x), memory, mask=memory_mask, need_weights=need_weights, cache=cache
            )
            x = r.after(x, h)
        x = self.ff_residual.after(x, self.ff(self.ff_residual.before(x)))
        return x, (self_weights, cross_weights)
