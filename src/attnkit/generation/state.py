"""The decoding state: what a model keeps between steps, and the run over the prefix.

    step t:  logits_t = decoder(y_t | cache of y_<t, memory of x)

`Cached` runs on the model's KV cache (`new_cache` + `decode_step`, offered by
`EncoderDecoder` and `DecoderOnly`), so each step costs one new position;
`Uncached` reruns every position and exists to check it. `prefill` runs the
prompt (or the decoder start id) once; both states then drop or reorder rows
(finished rows, beams) with `reorder`. A monotonic window over the source
(`GenerationConfig.monotonic_window`) lives in the encoder-decoder's decoding
state (`attnkit.models.decoding_state`), whose rows it follows, as do the
alignments that location-aware and monotonic attention carry; `Uncached` has
no cache, and `GenerationConfig` refuses the window without one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
from torch import Tensor

from attnkit.checks import of_type
from attnkit.errors import AttnkitError
from attnkit.generation import static_cache
from attnkit.generation.config import GenerationConfig
from attnkit.models import TransformerModel
from attnkit.models.base import bool_mask

log = logging.getLogger(__name__)


def left_pad(ids: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """Move each row's padding to its left, keeping token order, so every prompt ends last."""
    if mask is None:
        return ids, None
    order = torch.argsort(mask.int(), dim=1, stable=True)
    return ids.gather(1, order), mask.gather(1, order)


class Cached:
    """Decoding on the model's KV cache: each step runs only the new positions.

    `static` puts a `StaticKVCache` in its place where it can stand in, and runs each
    step compiled (CUDA graphs on a GPU); then rows never leave (`static` says so). Where it
    cannot, the dynamic cache decodes, with a line in the log when the static one was
    `asked` for (not when `auto` chose it).
    """

    def __init__(
        self,
        model,
        inputs,
        mask,
        prefix,
        prefix_mask,
        capacity: int,
        monotonic_window: tuple[int, int] | None = None,
        static: bool = False,
        asked: bool = True,
    ) -> None:
        self.model = model
        self.cache = model.new_cache(inputs, mask, capacity)
        if monotonic_window is not None:
            self.cache.set_monotonic(*monotonic_window)
        self.static = static and static_cache.supports(self.cache)
        if static and not self.static and asked:  # `auto` takes the dynamic cache quietly
            log.warning(
                "cache_implementation 'static' does not serve a ring window, a monotonic "
                "window, copying or location-aware and monotonic attention; decoding on the "
                "dynamic cache"
            )
        self._step = model.decode_step
        if self.static:
            self.cache = static_cache.static_like(self.cache)
            self._step = static_cache.compiled_step(model)
        self.logits = model.decode_step(prefix, self.cache, prefix_mask)

    def step(self, ids: Tensor) -> Tensor:
        if self.static:  # the graph's last outputs (these logits) have been read
            torch.compiler.cudagraph_mark_step_begin()
        return self._step(ids, self.cache)

    def reorder(self, index: Tensor, memory: bool) -> None:
        self.cache.reorder(index, memory)

    def repeat_rows(self, n: int) -> None:
        self.cache.repeat_rows(n)

    def close(self) -> None:
        """The decoding has ended: a static cache keeps its buffers for the next one."""
        if self.static:
            static_cache.release(self.cache)


class Uncached:
    """Decoding without a cache: every step reruns the decoder over all positions."""

    static = False

    def __init__(self, model, inputs, mask, prefix, prefix_mask, capacity: int) -> None:
        self.model = model
        self.encoder_decoder = model.config.shape == "encoder-decoder"
        self.memory, self.memory_mask, self.source = None, mask, None
        if self.encoder_decoder:
            self.memory = model.encode(inputs, mask)
            self.source = inputs  # what a pointer-generator copies from
        self.ids = prefix
        self.mask = (
            torch.ones_like(prefix, dtype=torch.bool) if prefix_mask is None else prefix_mask
        )
        self.logits = self._logits()

    def _logits(self) -> Tensor:
        if self.encoder_decoder:
            return self.model.decode(
                self.ids, self.memory, self.memory_mask, self.mask, src_ids=self.source
            )[:, -1]
        return self.model(self.ids, self.mask).logits[:, -1]

    def step(self, ids: Tensor) -> Tensor:
        self.ids = torch.cat([self.ids, ids], dim=1)
        self.mask = torch.cat([self.mask, torch.ones_like(ids, dtype=torch.bool)], dim=1)
        return self._logits()

    def repeat_rows(self, n: int) -> None:
        self.reorder(torch.arange(len(self.ids), device=self.ids.device).repeat_interleave(n), True)

    def close(self) -> None:
        """Nothing is kept between decodings without a cache."""

    def reorder(self, index: Tensor, memory: bool) -> None:
        self.ids, self.mask = self.ids.index_select(0, index), self.mask.index_select(0, index)
        if memory and self.memory is not None:
            self.memory = self.memory.index_select(0, index)
            self.source = self.source.index_select(0, index)
            if self.memory_mask is not None:
                self.memory_mask = self.memory_mask.index_select(0, index)


def prefix_of(
    model: TransformerModel, input_ids: Tensor, mask: Tensor | None, cfg: GenerationConfig
) -> tuple[Tensor, Tensor | None]:
    """The decoder's first inputs and their mask: the start id, or the left-padded prompt."""
    if model.config.shape == "encoder-decoder":
        rows = input_ids.shape[0]
        return torch.full((rows, 1), cfg.decoder_start_token_id, device=input_ids.device), None
    return left_pad(input_ids, mask)


def prefill(
    model: TransformerModel,
    input_ids: Tensor,
    mask: Tensor | None,
    cfg: GenerationConfig,
    crop: bool = False,
) -> tuple[Cached | Uncached, Tensor, Tensor | None, int]:
    """Run the prefix; return (decoder state, prefix ids, prefix mask, max_new_tokens).

    With `crop` the caller slides the context past max_len, so max_new_tokens is not cut.
    """
    shape = model.config.shape
    if shape not in ("encoder-decoder", "decoder"):
        raise AttnkitError(f"a {shape} model cannot generate; use an encoder-decoder or decoder")
    of_type("input_ids", input_ids, Tensor, "make one with torch.tensor(...)")
    if mask is not None:
        of_type("the padding mask of input_ids", mask, Tensor, "make one with torch.tensor(...)")
    if input_ids.dim() != 2 or input_ids.numel() == 0:
        raise AttnkitError(
            "input_ids must be a non-empty (batch, length) tensor, "
            f"got shape {tuple(input_ids.shape)}"
        )
    if mask is not None:
        mask = bool_mask(mask, "input_ids")
        empty = (~mask.any(-1)).nonzero().flatten().tolist()
        if empty:
            raise AttnkitError(
                f"input row {empty[0]} is all padding; give every row at least one token"
            )
    if cfg.monotonic_window is not None and shape != "encoder-decoder":
        raise AttnkitError(
            f"monotonic_window keeps cross-attention near a focus moving along the source, "
            f"but a {shape} model has no source; leave it None"
        )
    prefix, prefix_mask = prefix_of(model, input_ids, mask, cfg)
    max_len = model.config.max_len
    if prefix.shape[1] >= max_len:
        raise AttnkitError(
            f"the prompt has {prefix.shape[1]} tokens, which leaves no room under this model's "
            f"max_len {max_len}; shorten it"
        )
    max_new = cfg.max_new_tokens
    if prefix.shape[1] + max_new > max_len and not crop:
        max_new = max_len - prefix.shape[1]
        log.warning(
            "max_new_tokens %d does not fit max_len %d after a prefix of %d; generating at most %d",
            cfg.max_new_tokens,
            max_len,
            prefix.shape[1],
            max_new,
        )
    capacity = min(prefix.shape[1] + max_new, max_len)
    if cfg.use_cache:
        # A static cache holds the capacity it starts with: it cannot slide past max_len.
        slides = crop and prefix.shape[1] + max_new > max_len
        asked = cfg.cache_implementation == "static"
        static = static_cache.chosen(cfg.cache_implementation, prefix.device) == "static"
        # `auto` decodes on the static cache until it is full, then crops on the dynamic one
        if static and slides and asked:
            log.warning(
                "cache_implementation 'static' holds max_len %d positions and this decode "
                "slides past them; decoding on the dynamic cache",
                max_len,
            )
            static = False
        state = Cached(
            model, input_ids, mask, prefix, prefix_mask, capacity, cfg.monotonic_window, static,
            asked,
        )  # fmt: skip
    else:
        state = Uncached(model, input_ids, mask, prefix, prefix_mask, capacity)
    return state, prefix, prefix_mask, max_new


@contextlib.contextmanager
def evaluating(model: TransformerModel) -> Iterator[None]:
    """Eval mode (no dropout) while decoding; the model's mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
