"""What every model shape assembles: the input embedding and a stack of blocks.

Embed(ids) = Dropout(E[ids] * sqrt(d_model) + PE[positions])          (section 3.4, 3.5)
             (BERT adds a token-type vector T[types] and a norm before the dropout)
Stack(x)   = Norm?(Block_N(... Block_1(x)))                           (section 3.1)

The stack also owns what its blocks share: the RoPE tables, ALiBi's slopes,
and the masks of local and sparse attention, built once per forward pass.
"""

from __future__ import annotations

from torch import Tensor, nn

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.models.block import Block, Weights
from attnkit.nn import (
    AbsolutePositions,
    TokenEmbedding,
    make_norm,
    padding_mask,
    self_attention_mask,
)
from attnkit.nn.attention import local_mask, runs_blockwise, slot_distance
from attnkit.nn.embedding import check_ids
from attnkit.nn.kv_cache import KVCache
from attnkit.nn.positional import RotaryEmbedding, alibi_bias, alibi_slopes


class Embed(nn.Module):
    """Token embedding plus absolute positions (and token types, and a norm), then dropout."""

    def __init__(self, token: TokenEmbedding, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.token = token
        self.positions = (
            AbsolutePositions(c.max_len, c.d_model, c.positional == "learned", c.sinusoidal_layout)
            if c.positional in ("sinusoidal", "learned")
            else None
        )
        self.token_types = nn.Embedding(c.n_token_types, c.d_model) if c.n_token_types else None
        self.norm = make_norm(c.norm, c.d_model, c.norm_eps, c.bias) if c.embedding_norm else None
        self.dropout = nn.Dropout(c.embedding_dropout)

    def forward(
        self, ids: Tensor, positions: Tensor | None = None, token_types: Tensor | None = None
    ) -> Tensor:
        """`token_types` (batch, length) default to type 0 when the model has types."""
        x = self.token(ids)
        if self.positions is not None:
            x = self.positions(x, positions)
        if self.token_types is not None:
            if token_types is None:
                x = x + self.token_types.weight[0]
            else:
                if token_types.shape != ids.shape:
                    raise AttnkitError(
                        f"token_types has shape {tuple(token_types.shape)} but the ids have "
                        f"shape {tuple(ids.shape)}; give one type per token"
                    )
                check_ids(token_types, self.token_types.num_embeddings)
                x = x + self.token_types(token_types)
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)


class Stack(nn.Module):
    """N identical blocks; with pre-LN, a final norm closes the residual stream."""

    def __init__(self, config: ModelConfig, n_layers: int, *, causal: bool, cross: bool) -> None:
        super().__init__()
        c = config
        self.causal = causal
        self.window, self.stride = c.attention_window, c.attention_stride
        rotary = (
            RotaryEmbedding(
                c.d_head,
                c.max_len,
                c.rope_theta,
                scaling=c.rope_scaling,
                kind=c.rope_scaling_type,
                original_max_len=c.rope_original_max_len,
            )
            if c.positional == "rope"
            else None
        )
        self.alibi_slopes: Tensor | None
        if c.positional == "alibi":
            self.register_buffer("alibi_slopes", alibi_slopes(c.n_heads), persistent=False)
        else:
            self.alibi_slopes = None
        self.blocks = nn.ModuleList(
            Block(config, causal=causal, cross=cross, rotary=rotary) for _ in range(n_layers)
        )
        self.norm = (
            make_norm(config.norm, config.d_model, config.norm_eps, config.bias)
            if config.final_norm
            else None
        )

    def forward(
        self,
        x: Tensor,
        key_mask: Tensor | None = None,
        *,
        memory: Tensor | None = None,
        memory_key_mask: Tensor | None = None,
        positions: Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, list[Weights]]:
        """x: (batch, length, d_model); masks are (batch, length) with True for real tokens.

        With a `cache` (already extended by `KVCache.extend` for these
        positions) the masks come from the cache and `key_mask` is unused.
        """
        # A window (and stride) over a long sequence runs block by block, with no mask
        # (`local_attention`); the weights, a cache and ALiBi need the mask.
        length = x.shape[1]
        blockwise = (
            cache is None
            and self.alibi_slopes is None
            and not need_weights
            and runs_blockwise(length, self.window, self.stride)
        )
        window = self.window if blockwise else 0
        # Masks are built once here, not once per layer.
        if cache is None:
            mask = None if window else self_attention_mask(key_mask, length, self.causal)
            memory_mask = None if memory_key_mask is None else padding_mask(memory_key_mask)
        else:
            mask, memory_mask = cache.mask, cache.memory_mask
        if (self.window or self.alibi_slopes is not None) and not window:
            # Distances from each new query to each key, in the order the keys are held.
            if cache is None:
                distance = slot_distance(length, length, x.device)
            else:
                distance = cache.distance()
            mask, bias = self._relative(mask, distance)
        else:
            bias = None
        weights = []
        for i, block in enumerate(self.blocks):
            x, w = block(
                x,
                mask=mask,
                bias=bias,
                memory=memory,
                memory_mask=memory_mask,
                positions=positions,
                need_weights=need_weights,
                cache=None if cache is None else cache.layers[i],
                key_mask=key_mask if cache is None else None,
                window=window,
                stride=self.stride if window else 0,
            )
            weights.append(w)
        if self.norm is not None:
            x = self.norm(x)
        return x, weights

    def _relative(
        self, mask: Tensor | None, distance: Tensor
    ) -> tuple[Tensor | None, Tensor | None]:
        """The mask narrowed to the local window, and ALiBi's bias with the mask folded in.

        Distances are counted in slots (`slot_distance`): padding sits only at
        the ends, so within a sequence slot distances are position distances.
        """
        if self.window:
            local = local_mask(distance, self.window, self.stride, causal=self.causal)
            mask = local if mask is None else mask & local
        if self.alibi_slopes is None:
            return mask, None
        bias = alibi_bias(self.alibi_slopes, distance)
        # Only one cached query, which sees every key, comes here without a mask.
        if mask is not None:
            bias = bias.masked_fill(~mask, float("-inf"))
        return None, bias
