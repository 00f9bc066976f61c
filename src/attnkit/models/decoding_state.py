"""What an encoder-decoder keeps between the steps of a decode.

    kv_cache  the keys and values of every layer: self-attention's, growing a position a
              step, and cross-attention's over the memory, computed once (`KVCache`)
    source    what a pointer-generator copies from: the memory h_i and the source ids
              (`nn/copy.py`); None for a model that does not copy
    window    the monotonic window over the source and its focus (`nn/monotonic.py`),
              when a decode asks for one (`set_monotonic`)
    alignment what location-aware or monotonic cross-attention carries from step to
              step, per layer (`nn/alignment_state.py`); None for a model without them

`EncoderDecoder.new_cache` makes one and `decode_step` reads it. Beam search
and the dropping of finished rows reorder them all together, so a beam keeps
its parent's keys, its sentence's source, its parent's focus and alignments.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from attnkit.nn.alignment_state import AlignmentState
from attnkit.nn.kv_cache import KVCache
from attnkit.nn.monotonic import MonotonicWindow


class CopySource(NamedTuple):
    """What a pointer-generator copies from: the memory (rows, source length, d_model) and the
    source ids (rows, source length) in its extended vocabulary, one row per memory row."""

    memory: Tensor
    ids: Tensor


class DecodingState:
    """An encoder-decoder's decode between steps: `kv_cache`, `source`, `window` and
    `alignment` (see the module docstring). `reorder` and `repeat_rows` are `KVCache`'s,
    applied to all of them."""

    def __init__(
        self,
        kv_cache: KVCache,
        source: CopySource | None = None,
        alignment: AlignmentState | None = None,
    ) -> None:
        self.kv_cache, self.source, self.alignment = kv_cache, source, alignment
        self.window: MonotonicWindow | None = None

    @property
    def batch_size(self) -> int:
        return self.kv_cache.batch_size

    def set_monotonic(self, back: int, ahead: int) -> None:
        """From the next step on, keep cross-attention within [f - back, f + ahead] of a focus f
        that starts at the first source token and follows the last layer's attention."""
        kv = self.kv_cache
        if kv.memory_mask is None:
            length = kv.memory_kv.shape[4]
            real = kv.key_mask.new_ones(kv.batch_size, length)
        else:  # one row of the memory serves `group` rows of the batch
            real = kv.memory_mask[:, 0, 0].repeat_interleave(kv.group, 0)
        self.window = MonotonicWindow(back, ahead, real)

    def reorder(self, index: Tensor, memory: bool = True) -> None:
        """`KVCache.reorder`: keep the rows `index`; the window's and the alignments' rows
        follow, and with `memory` the source's rows too."""
        if memory and self.source is not None:  # the source's rows are the memory's
            rows = self.kv_cache.memory_rows(index)
            self.source = CopySource(*(part.index_select(0, rows) for part in self.source))
        self.kv_cache.reorder(index, memory)
        self._reorder_policies(index)

    def repeat_rows(self, n: int) -> None:
        """`KVCache.repeat_rows`: each row becomes `n` rows sharing its memory and its source."""
        rows = torch.arange(self.batch_size, device=self.kv_cache.key_mask.device)
        self._reorder_policies(rows.repeat_interleave(n))
        self.kv_cache.repeat_rows(n)

    def _reorder_policies(self, index: Tensor) -> None:
        """The window and the alignments, one row each per row of the batch, keep `index`."""
        for policy in (self.window, self.alignment):
            if policy is not None:
                policy.reorder(index)
