"""What every model shape assembles: the input embedding and a stack of blocks.

Embed(ids) = Dropout(E[ids] * sqrt(d_model) + a PE[positions])        (section 3.4, 3.5)
             (BERT adds a token-type vector T[types] and a norm before the dropout)
Stack(x)   = Norm?(Block_N(... Block_1(x)))                           (section 3.1)

The stack also owns what its blocks share: the RoPE tables, ALiBi's slopes,
T5's relative biases, a Linformer projection shared by every layer, and the
attention `Window`. Once per forward pass it chooses how attention
runs and builds the masks and the bias, in one `AttentionInputs` that every
block reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import torch
from torch import Tensor, nn

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.models.block import Block, Weights
from attnkit.nn import (
    AbsolutePositions,
    AttentionInputs,
    AttentionPath,
    TokenEmbedding,
    Window,
    make_norm,
    padding_mask,
    self_attention_mask,
)
from attnkit.nn.alignment_state import AlignmentState
from attnkit.nn.embedding import check_ids
from attnkit.nn.kv_cache import KVCache
from attnkit.nn.linformer import LinformerProjection
from attnkit.nn.masks import local_mask, slot_distance
from attnkit.nn.positional import RotaryEmbedding, XPos, alibi_bias, alibi_slopes
from attnkit.nn.positional_combine import ConcatPositions
from attnkit.nn.relative_bias import RelativePositionBias


class Embed(nn.Module):
    """Token embedding plus absolute positions (and token types, and a norm), then dropout."""

    def __init__(self, token: TokenEmbedding, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.token = token
        self.positions = (
            AbsolutePositions(
                c.max_len,
                c.d_model,
                c.positional == "learned",
                c.sinusoidal_layout,
                c.positional_scale,
                c.positional_interpolation,
            )
            if c.positional in ("sinusoidal", "learned")
            else None
        )
        # positional_combine = "concat": [x; PE] W_c instead of x + PE.
        self.combine = (
            ConcatPositions(c.d_model, c.bias) if c.positional_combine == "concat" else None
        )
        self.token_types = nn.Embedding(c.n_token_types, c.d_model) if c.n_token_types else None
        self.norm = make_norm(c.norm, c.d_model, c.norm_eps, c.bias) if c.embedding_norm else None
        self.dropout = nn.Dropout(c.embedding_dropout)

    def forward(
        self, ids: Tensor, positions: Tensor | None = None, token_types: Tensor | None = None
    ) -> Tensor:
        """`token_types` (batch, length) default to type 0 when the model has types."""
        x = self.token(ids)
        if self.combine is not None:
            x = self.combine(x, self.positions.vectors(x.shape[1], positions))
        elif self.positions is not None:
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
        # Global and random keys are an encoder's (Longformer, BigBird): causal stacks skip them.
        extra = (0, 0) if causal else (c.attention_global, c.attention_random)
        self.window = Window(c.attention_window, c.attention_stride, *extra)
        self.max_len = c.max_len
        rope = {
            "scaling": c.rope_scaling,
            "kind": c.rope_scaling_type,
            "original_max_len": c.rope_original_max_len,
        }
        rotary = {
            "rope": lambda: RotaryEmbedding(c.d_head, c.max_len, c.rope_theta, **rope),
            "xpos": lambda: XPos(c.d_head, c.max_len, c.rope_theta, c.xpos_scale_base, **rope),
        }
        # xPos decays with distance looking back; looking forward (an encoder) its factor
        # would grow with distance instead, so a non-causal stack rotates as plain RoPE.
        kind = "rope" if c.positional == "xpos" and not causal else c.positional
        rotary = rotary.get(kind, lambda: None)()
        self.alibi_slopes: Tensor | None
        if c.positional == "alibi":
            self.register_buffer("alibi_slopes", alibi_slopes(c.n_heads), persistent=False)
        else:
            self.alibi_slopes = None
        # T5: one table of biases for the stack, shared by its layers (`nn/relative_bias.py`).
        self.relative_bias = None
        if c.positional == "t5-relative":
            self.relative_bias = RelativePositionBias(
                c.n_heads,
                c.relative_buckets,
                c.relative_max_distance,
                c.max_len,
                bidirectional=not causal,
                init_std=c.d_model**-0.5,
            )
        # Linformer's layerwise sharing: one projection for every layer's keys and values.
        shared = c.attention_kind == "linformer" and c.linformer_sharing == "layerwise"
        linformer = LinformerProjection(c.linformer_k, c.max_len, True) if shared else None
        self.blocks = nn.ModuleList(
            Block(config, causal=causal, cross=cross, rotary=rotary, linformer=linformer)
            for _ in range(n_layers)
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
        cross_weights: Collection[int] = (),
        memory_window: Tensor | None = None,
        alignment: AlignmentState | None = None,
    ) -> tuple[Tensor, list[Weights]]:
        """x: (batch, length, d_model); masks are (batch, length) with True for real tokens.

        `need_weights` returns the weights of every attention; `cross_weights`
        those of the cross-attention of the layers it lists (0 is the first),
        the others running fused.

        With a `cache` (already extended by `KVCache.extend` for these
        positions) the masks come from the cache and `key_mask` is unused;
        `memory_window` then narrows each row's cross-attention (a monotonic window), and
        `alignment` holds what location-aware or monotonic cross-attention carries.
        """
        length = x.shape[1]
        path = AttentionPath.choose(
            length,
            self.window,
            need_weights=need_weights,
            cached=cache is not None,
            alibi=self._biased,
        )
        # The masks are built once here, not once per layer.
        if cache is not None:
            mask, bias = self._relative(cache.mask, length, cache, x.device)
            memory_mask, key_mask = cache.memory_mask, None
        else:
            mask = bias = None
            if path is not AttentionPath.BLOCKWISE and not self._causal_flag_serves(key_mask):
                mask = self_attention_mask(key_mask, length, self.causal)
                mask, bias = self._relative(mask, length, None, x.device)
            memory_mask = None if memory_key_mask is None else padding_mask(memory_key_mask)
        inputs = AttentionInputs(
            path=path,
            causal=self.causal,
            mask=mask,
            bias=bias,
            positions=positions,
            key_mask=key_mask,
            window=self.window,
            memory=memory,
            memory_mask=memory_mask,
            memory_window=memory_window,
            alignment=alignment,
        )
        layers = (None,) * len(self.blocks) if cache is None else cache.layers
        each = [inputs] * len(self.blocks)
        if cache is None and path is not AttentionPath.BLOCKWISE:
            each = [self._with_extra_keys(inputs, i, length) for i in range(len(self.blocks))]
        weights = []
        for i, (block, layer) in enumerate(zip(self.blocks, layers, strict=True)):
            x, w = block(x, each[i], layer, i in cross_weights)
            weights.append(w)
        if self.norm is not None:
            x = self.norm(x)
        return x, weights

    def _with_extra_keys(self, inputs: AttentionInputs, layer: int, length: int) -> AttentionInputs:
        """`inputs` with layer `layer`'s global and random keys (real ones) added to its mask."""
        if inputs.mask is None:  # no window, hence no extra keys (`ModelConfig` checks)
            return inputs
        extra = self.window.extra_keys(length, layer, self.max_len, inputs.mask.device)
        if extra is None:
            return inputs
        if inputs.key_mask is not None:
            extra = extra & padding_mask(inputs.key_mask)
        return dataclasses.replace(inputs, mask=inputs.mask | extra)

    def _causal_flag_serves(self, key_mask: Tensor | None) -> bool:
        """Whether causality alone masks all a real query must not see: no window, no ALiBi,
        and no padding but at the ends of rows.

        Right padding follows every real token, so causality hides it from every
        real query; a padding query then attends to the keys up to itself, and
        its output is read by no real one. The flag keeps the fused kernels
        eligible (a GPU's flash kernel takes no mask) and lets them skip the
        masked half of the scores.
        """
        if not self.causal or self.window.size or self._biased:
            return False
        return key_mask is None or bool((key_mask[:, 1:] <= key_mask[:, :-1]).all())

    @property
    def _biased(self) -> bool:
        """Whether a bias over distances joins the scores: ALiBi's or T5's."""
        return self.alibi_slopes is not None or self.relative_bias is not None

    def _relative(
        self, mask: Tensor | None, length: int, cache: KVCache | None, device: torch.device
    ) -> tuple[Tensor | None, Tensor | None]:
        """The mask narrowed to the local window, and ALiBi's or T5's bias with the mask folded
        in.

        Distances are counted in slots (`slot_distance`): padding sits only at
        the ends, so within a sequence slot distances are position distances.
        """
        if not self.window.size and not self._biased:
            return mask, None
        # Distances from each new query to each key, in the order the keys are held.
        distance = slot_distance(length, length, device) if cache is None else cache.distance()
        if self.window.size:
            window = self.window
            local = local_mask(distance, window.size, window.stride, causal=self.causal)
            mask = local if mask is None else mask & local
        if not self._biased:
            return mask, None
        if self.relative_bias is not None:
            bias = self.relative_bias(distance)
        else:
            bias = alibi_bias(self.alibi_slopes, distance)
        # Only one cached query, which sees every key, comes here without a mask.
        if mask is not None:
            bias = bias.masked_fill(~mask, float("-inf"))
        return None, bias
