"""One Transformer layer (section 3.1, figure 1).

An encoder layer is self-attention then the feed-forward network; a decoder
layer puts cross-attention over the encoder output (the "memory") between
the two, and masks its self-attention causally so position i sees only
positions <= i. Each sub-layer sits in a residual connection with its norm.
With RoPE the self-attention turns its queries and keys by position; with
DeepNorm the residuals carry alpha and the initial weights beta; with
adapters each sub-layer's output passes its adapter before the residual sum.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.config import ModelConfig
from attnkit.nn import (
    AttentionInputs,
    FeedForward,
    MixtureOfExperts,
    MultiHeadAttention,
    Residual,
    make_norm,
)
from attnkit.nn.adapters import Adapter
from attnkit.nn.kv_cache import LayerKV
from attnkit.nn.linformer import LinformerAttention, LinformerProjection
from attnkit.nn.location_attention import LocationAwareAttention
from attnkit.nn.monotonic_attention import MonotonicAttention
from attnkit.nn.norm import deepnorm_constants
from attnkit.nn.positional import RotaryEmbedding

Weights = tuple[Tensor | None, Tensor | None]


class Block(nn.Module):
    """One layer: self-attention, cross-attention over the memory (a decoder's, with
    `cross`), then the feed-forward network or a mixture of experts, each a sub-layer in
    its residual connection and norm (`Residual`: post-LN, pre-LN or DeepNorm).

    causal: queries see only earlier keys (a decoder); rotary: the RoPE or xPos tables its
        stack shares, which turn self-attention's queries and keys. An adapter follows each
        sub-layer when the config (or `add_adapters`) asks for them.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        causal: bool,
        cross: bool,
        rotary: RotaryEmbedding | None = None,
        linformer: LinformerProjection | None = None,
    ) -> None:
        """`rotary` and `linformer` are what the stack shares among its blocks, if anything."""
        super().__init__()
        c = config
        # A causal stack is a decoder, the other an encoder; DeepNet sets each apart.
        alpha, self.beta = (1.0, 1.0)
        if c.norm_position == "deepnorm":
            side = "decoder" if causal else "encoder"
            alpha, self.beta = deepnorm_constants(c.n_encoder_layers, c.n_decoder_layers)[side]

        def residual() -> Residual:
            norm = make_norm(c.norm, c.d_model, c.norm_eps, c.bias)
            return Residual(norm, c.norm_position, c.dropout, alpha)

        self.self_attn, self.self_attn_residual = (
            make_attention(c, causal, rotary, linformer),
            residual(),
        )
        self.cross_attn = make_attention(c, causal, cross=True) if cross else None
        self.cross_attn_residual = residual() if cross else None
        self.ff = (
            MixtureOfExperts(
                c.d_model,
                c.d_ff,
                c.n_experts,
                c.n_experts_per_token,
                c.activation,
                c.bias,
                c.activation_dropout,
                c.router,
                c.capacity_factor,
            )
            if c.n_experts
            else FeedForward(c.d_model, c.d_ff, c.activation, c.bias, c.activation_dropout)
        )
        self.ff_residual = residual()
        self.d_model = c.d_model
        self.self_attn_adapter: Adapter | None = None
        self.cross_attn_adapter: Adapter | None = None
        self.ff_adapter: Adapter | None = None
        if c.adapter_size:
            self.add_adapters(c.adapter_size)

    def add_adapters(self, size: int) -> None:
        """An adapter (`nn/adapters.py`) after each attention sub-layer and the FFN."""
        self.self_attn_adapter = Adapter(self.d_model, size)
        if self.cross_attn is not None:
            self.cross_attn_adapter = Adapter(self.d_model, size)
        self.ff_adapter = Adapter(self.d_model, size)

    def residual_projections(self) -> list[nn.Parameter]:
        """The weights whose products are added to the residual stream: each attention's
        output projection and each feed-forward's W_2."""
        attentions = [a for a in (self.self_attn, self.cross_attn) if a is not None]
        ffns = [f for f in self.ff.modules() if isinstance(f, FeedForward)]
        return [a.out_proj.weight for a in attentions] + [f.w_2.weight for f in ffns]

    @torch.no_grad()
    def scale_initial_weights(self) -> None:
        """DeepNet's initialisation: value, output and feed-forward weights times beta.

        Queries and keys keep theirs: they set where attention looks, not how
        much the sub-layer adds to the residual stream.
        """
        for attn in (self.self_attn, self.cross_attn):
            if attn is None:
                continue
            values = attn.kv_proj if attn.cross else attn.qkv_proj
            v_dim = attn.n_kv_heads * attn.d_head
            values.weight[-v_dim:].mul_(self.beta)
            attn.out_proj.weight.mul_(self.beta)
        for ffn in self.ff.modules():
            if isinstance(ffn, FeedForward):
                ffn.w_1.weight.mul_(self.beta)
                ffn.w_2.weight.mul_(self.beta)

    def forward(
        self,
        x: Tensor,
        inputs: AttentionInputs,
        cache: LayerKV | None = None,
        cross_weights: bool = False,
    ) -> tuple[Tensor, Weights]:
        """x: (batch, length, d_model) -> same shape, plus (self, cross) attention weights.

        `inputs` is what every layer of the stack shares (masks, bias,
        positions, memory, path); `cache` is this layer's part of a `KVCache`
        when decoding step by step; `cross_weights` asks this layer alone for
        its cross-attention weights.
        """
        r = self.self_attn_residual
        h, self_weights = self.self_attn(r.before(x), inputs, cache)
        x = r.after(x, _adapted(self.self_attn_adapter, h))
        cross = None
        if self.cross_attn is not None:
            r = self.cross_attn_residual
            h, cross = self.cross_attn(r.before(x), inputs, cache, cross_weights)
            x = r.after(x, _adapted(self.cross_attn_adapter, h))
        h = self.ff_residual.before(x)
        h = self.ff(h, inputs.key_mask) if isinstance(self.ff, MixtureOfExperts) else self.ff(h)
        x = self.ff_residual.after(x, _adapted(self.ff_adapter, h))
        return x, (self_weights, cross)


def make_attention(
    c: ModelConfig,
    causal: bool,
    rotary: RotaryEmbedding | None = None,
    linformer: LinformerProjection | None = None,
    *,
    cross: bool = False,
) -> MultiHeadAttention:
    """The attention layer that `c.attention_kind` gives this place: Linformer for an encoder's
    self-attention, location-aware or monotonic attention for cross-attention, else the paper's.

    `linformer` is the stack's shared projection (layerwise sharing); without it each layer
    makes its own.
    """
    options = {
        "bias": c.bias,
        "dropout": c.attention_dropout,
        "backend": c.attention_backend,
        "d_head": c.d_head,
        "scale_scores": c.scale_scores,
    }
    kind = c.attention_kind
    if kind == "linformer" and not (cross or causal):
        shared_kv = c.linformer_sharing != "headwise"
        projection = linformer or LinformerProjection(c.linformer_k, c.max_len, shared_kv)
        return LinformerAttention(
            c.d_model, c.n_heads, projection, n_kv_heads=c.n_kv_heads, **options
        )
    if cross and kind == "location-aware":
        filters, kernel = c.location_filters, c.location_kernel
        return LocationAwareAttention(
            c.d_model, c.n_heads, c.n_kv_heads, filters=filters, kernel=kernel, **options
        )
    if cross and kind == "monotonic":
        return MonotonicAttention(
            c.d_model,
            c.n_heads,
            c.n_kv_heads,
            chunk=c.monotonic_chunk,
            noise=c.monotonic_noise,
            energy_bias=c.monotonic_bias,
            **options,
        )
    return MultiHeadAttention(
        c.d_model, c.n_heads, c.n_kv_heads, cross=cross, rotary=None if cross else rotary, **options
    )


def _adapted(adapter: Adapter | None, h: Tensor) -> Tensor:
    """A sub-layer's output through its adapter, if the block has one."""
    return h if adapter is None else adapter(h)
