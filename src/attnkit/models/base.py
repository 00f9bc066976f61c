"""What the three model shapes share: input checks, outputs, initialisation, counts."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.checks import of_type
from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.models.block import Block, Weights
from attnkit.nn.alignment_state import AlignmentState
from attnkit.nn.embedding import TokenEmbedding
from attnkit.nn.kv_cache import KVCache


@dataclass
class Output:
    """A forward pass's result.

    logits: (batch, length, vocab) scores before the softmax (a pointer-generator's
        log-probabilities over its extended vocabulary); None when the forward
        pass was asked for `need_logits=False` (a fused loss projects `hidden` itself).
    hidden: (batch, length, d_model) the last stack's output.
    attentions: with `need_weights`, the weights (batch, heads, queries, keys)
        of every layer, under "encoder", "decoder" (self) and "cross"; with
        `cross_weights`, those of the cross-attention of the layers asked, under "cross".
    """

    logits: Tensor | None
    hidden: Tensor
    attentions: dict[str, list[Tensor]] | None = None


class TransformerModel(nn.Module):
    """Base of `EncoderDecoder`, `DecoderOnly` and `EncoderOnly`."""

    config: ModelConfig

    def _init_weights(self) -> None:
        """Glorot-uniform linear weights and zero biases, as torch.nn.Transformer; or, with
        `init = "gpt2"`, GPT-2's: every linear and embedding weight N(0, 0.02), and the
        projections that write into the residual stream (attention's output, the FFN's W_2)
        N(0, 0.02 / sqrt(2 L)) for L blocks, so the stream's variance does not grow with depth.

        DeepNorm then scales some of them down by its beta (`Block.scale_initial_weights`).

        Runs before weight tying, so a tied output projection keeps the
        embedding's initialisation.
        """
        gpt2 = self.config.init == "gpt2"
        for module in self.modules():
            if isinstance(module, nn.Linear):
                if gpt2:
                    nn.init.normal_(module.weight, std=0.02)
                else:
                    nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif gpt2 and isinstance(module, TokenEmbedding):
                nn.init.normal_(module.weight, std=0.02)
        if gpt2:
            blocks = [m for m in self.modules() if isinstance(m, Block)]
            for block in blocks:
                for weight in block.residual_projections():
                    nn.init.normal_(weight, std=0.02 / math.sqrt(2 * len(blocks)))
        if self.config.norm_position == "deepnorm":
            for module in self.modules():
                if isinstance(module, Block):
                    module.scale_initial_weights()

    def _check(self, ids: Tensor, mask: Tensor | None, name: str) -> Tensor | None:
        """Validate ids (batch, length) and their padding mask; return the mask as bool."""
        hint = "make one with torch.tensor(...)"
        of_type(name, ids, Tensor, hint)
        if mask is not None:
            of_type(f"the padding mask of {name}", mask, Tensor, hint)
        if ids.dim() != 2:
            raise AttnkitError(
                f"{name} must be a (batch, length) tensor of token ids, "
                f"got shape {tuple(ids.shape)}"
            )
        if ids.numel() == 0:
            raise AttnkitError(
                f"{name} is empty (shape {tuple(ids.shape)}); give at least one sequence of at "
                "least one token"
            )
        if ids.shape[1] > self.config.max_len:
            raise AttnkitError(
                f"{name} has length {ids.shape[1]}, over max_len {self.config.max_len} of this "
                "model; truncate the input or build the model with a larger max_len"
            )
        if mask is None:
            return None
        if mask.shape != ids.shape:
            raise AttnkitError(
                f"the padding mask of {name} has shape {tuple(mask.shape)} but {name} has shape "
                f"{tuple(ids.shape)}; a padding mask is (batch, length) with True for real tokens"
            )
        return bool_mask(mask, name)

    @staticmethod
    def positions_from_mask(mask: Tensor | None) -> Tensor | None:
        """Position of each token counted over real tokens only.

        With right padding this is 0, 1, 2, ... as usual; with left padding it
        starts each sequence at 0 too, so a sequence gets the same result
        whatever padding sits beside it in the batch.
        """
        return None if mask is None else (mask.long().cumsum(-1) - 1).clamp(min=0)

    def _new_cache(self, batch_size: int, capacity: int | None) -> KVCache:
        c = self.config
        capacity = c.max_len if capacity is None else capacity
        if not 1 <= capacity <= c.max_len:
            raise AttnkitError(
                f"a decoding cache of {capacity} positions does not fit this model's max_len "
                f"{c.max_len}; ask for fewer new tokens or shorten the input"
            )
        param = next(self.parameters())
        return KVCache(
            c.n_decoder_layers,
            batch_size,
            c.n_kv_heads,
            c.d_head,
            capacity,
            window=self.decoder.window,
            dtype=param.dtype,
            device=param.device,
        )

    def _output(
        self, hidden: Tensor, attentions: dict[str, list[Tensor]] | None, need_logits: bool
    ) -> Output:
        return Output(self.head(hidden) if need_logits else None, hidden, attentions)

    def _step(self, embed: nn.Module, ids: Tensor, cache: KVCache, mask: Tensor | None) -> Tensor:
        """Run new ids (batch, n) through the decoder on `cache`; logits of the last one."""
        hidden, _ = self._step_hidden(embed, ids, cache, mask)
        return self.head(hidden[:, -1])

    def _step_hidden(
        self,
        embed: nn.Module,
        ids: Tensor,
        cache: KVCache,
        mask: Tensor | None,
        cross_weights: tuple[int, ...] = (),
        memory_window: Tensor | None = None,
        alignment: AlignmentState | None = None,
    ) -> tuple[Tensor, list[Weights]]:
        """The decoder's hidden states (batch, n, d_model) of new ids on `cache`, and the
        cross-attention weights of the layers `cross_weights` lists; `memory_window`
        restricts the cross-attention of each row (`AttentionInputs.memory_window`), and
        `alignment` carries location-aware or monotonic attention's alignments."""
        mask = self._check(ids, mask, "ids")
        if ids.shape[0] != cache.batch_size:
            raise AttnkitError(
                f"the ids have {ids.shape[0]} rows but the cache holds {cache.batch_size}; "
                "reorder the cache when the batch changes"
            )
        positions = cache.extend(mask, ids.shape[1])
        return self.decoder(
            embed(ids, positions),
            positions=positions,
            cache=cache,
            cross_weights=cross_weights,
            memory_window=memory_window,
            alignment=alignment,
        )

    def num_parameters(self, trainable_only: bool = False) -> int:
        """Number of distinct parameters (a tied matrix counts once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def parameter_counts(self) -> dict[str, int]:
        """Parameters per top-level part; a shared tensor counts in the first part that has it."""
        seen: set[int] = set()
        counts: dict[str, int] = {}
        for name, child in self.named_children():
            n = 0
            for p in child.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    n += p.numel()
            counts[name] = n
        counts["total"] = sum(counts.values())
        return counts

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device


def bool_mask(mask: Tensor, name: str) -> Tensor:
    """A padding mask as bool, True for real tokens: a bool mask, or integers that are all 0
    or 1; anything else is refused.

    An additive mask, 0 for real tokens and -inf (or -10000) for padding, whether float
    (torch's) or integer (`torch.where(ids == pad, -10000, 0)`), would read as bool with the
    padding inverted; so would 0 / 2. No such mask is guessed at.
    """
    if mask.dtype == torch.bool:
        return mask
    if mask.is_floating_point() or mask.is_complex():
        held = f"floats ({mask.dtype})"
    elif bool(((mask == 0) | (mask == 1)).all()):
        return mask.bool()
    else:
        values = mask.unique()[:4].tolist()
        held = f"{mask.dtype} values other than 0 and 1 ({', '.join(map(str, values))}, ...)"
    raise AttnkitError(
        f"the padding mask of {name} holds {held}; attnkit's padding masks are True (or 1) for "
        "real tokens and False (or 0) for padding, so pass `mask == 0` for an additive 0 / -inf "
        "mask"
    )


def unwrap(model: nn.Module) -> TransformerModel:
    """The plain model under DDP (`.module`) and torch.compile (`._orig_mod`)."""
    while isinstance(model, nn.parallel.DistributedDataParallel) or hasattr(model, "_orig_mod"):
        is_ddp = isinstance(model, nn.parallel.DistributedDataParallel)
        model = model.module if is_ddp else model._orig_mod
    return model


def collect(weights: list[tuple[Tensor | None, Tensor | None]], which: int) -> list[Tensor]:
    """One kind of attention weights (0 self, 1 cross) from every layer."""
    return [w[which] for w in weights if w[which] is not None]
