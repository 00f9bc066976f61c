"""The key-value cache: what a decoder has already computed, kept for the next step.

At step t a causal decoder needs K_{<=t} and V_{<=t} of every layer, but the
keys and values of positions < t do not change (causality), so each step
computes only its own and appends them:

    K_{<=t} = [K_{<t}; x_t W^K],   V_{<=t} = [V_{<t}; x_t W^V]

Cross-attention keys and values depend only on the encoder memory, so they are
computed once per source, and the beams of a sentence share them (`group`).
Buffers are preallocated for the whole decode, so a step writes in place and
never concatenates; beam search reorders the rows by batch index, copying only
the positions written so far into a spare buffer.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.errors import AttnkitError
from attnkit.nn.attention import causal_mask, padding_mask, self_attention_mask


class LayerKV:
    """One layer's view of a `KVCache`, handed to that layer's attention."""

    def __init__(self, cache: KVCache, index: int) -> None:
        self.cache, self.index = cache, index

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new positions' (batch, kv_heads, n, d_head) keys and values.

        Returns the keys and values of every position so far (views, no copy).
        """
        cache = self.cache
        end = cache.length
        kv = cache.kv[self.index]
        kv[0, :, :, end - k.shape[2] : end] = k
        kv[1, :, :, end - v.shape[2] : end] = v
        return kv[0, :, :, :end], kv[1, :, :, :end]

    def memory(self) -> tuple[Tensor, Tensor] | None:
        """The cross-attention keys and values over the memory, when computed."""
        memory_kv = self.cache.memory_kv
        return None if memory_kv is None else (memory_kv[self.index, 0], memory_kv[self.index, 1])


class KVCache:
    """Preallocated self-attention keys and values of every layer, plus cross-attention ones.

    kv: (layers, 2, batch, kv_heads, capacity, d_head), filled up to `length`.
    key_mask: (batch, capacity), True where the key is a real token; left
        padding of prompts stays False, so padded keys are never attended.
    memory_kv: (layers, 2, batch / group, kv_heads, source length, d_head) or None.
    memory_mask: (batch / group, 1, 1, source length) over the memory, or None.
    group: rows of the batch per row of the memory; beam search makes it the
        number of beams, rows being sentence * beams + beam (`repeat_rows`).
    """

    def __init__(
        self,
        n_layers: int,
        batch_size: int,
        n_kv_heads: int,
        d_head: int,
        capacity: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.kv = torch.empty(
            n_layers, 2, batch_size, n_kv_heads, capacity, d_head, dtype=dtype, device=device
        )
        self.key_mask = torch.zeros(batch_size, capacity, dtype=torch.bool, device=device)
        self.n_real = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.length = 0
        self.padded = False
        self.memory_kv: Tensor | None = None
        self.memory_mask: Tensor | None = None
        self.mask: Tensor | None = None
        self._spare: Tensor | None = None
        self.group = 1
        self.layers = [LayerKV(self, i) for i in range(n_layers)]

    @property
    def capacity(self) -> int:
        return self.kv.shape[4]

    @property
    def batch_size(self) -> int:
        return self.kv.shape[2]

    def set_memory(self, memory_kv: list[tuple[Tensor, Tensor]], memory_key_mask: Tensor | None):
        """Keep each layer's cross-attention (keys, values) over the memory, computed once."""
        self.memory_kv = torch.stack([torch.stack(kv) for kv in memory_kv])
        self.memory_mask = None if memory_key_mask is None else padding_mask(memory_key_mask)

    def extend(self, key_mask: Tensor | None, n: int) -> Tensor:
        """Reserve the next `n` positions for new tokens; return their positions (batch or 1, n).

        `key_mask` (batch, n) is True for real tokens (None: all real). Also
        sets `self.mask`, the self-attention mask of the new queries over all
        keys so far (None when nothing is masked).
        """
        start, end = self.length, self.length + n
        if end > self.capacity:
            raise AttnkitError(
                f"the KV cache holds {self.capacity} positions and {end} are needed; "
                "make it with a larger capacity"
            )
        self.length = end
        if key_mask is None:
            self.key_mask[:, start:end] = True
            steps = torch.arange(n, device=self.n_real.device)
            positions = (self.n_real[:, None] + steps) if self.padded else (start + steps)[None]
            self.n_real += n
        else:
            self.key_mask[:, start:end] = key_mask
            self.padded = self.padded or not bool(key_mask.all())
            positions = (self.n_real[:, None] + key_mask.long().cumsum(-1) - 1).clamp(min=0)
            self.n_real += key_mask.sum(-1)
        if self.padded:
            self.mask = self_attention_mask(self.key_mask[:, :end], n, causal=True)
        else:
            # One new query is the last position: it may attend to every key.
            self.mask = None if n == 1 else causal_mask(n, end, self.kv.device)
        return positions

    def repeat_rows(self, n: int) -> None:
        """Each row becomes `n` consecutive rows (the beams of a sentence) sharing its memory."""
        index = torch.arange(self.batch_size, device=self.kv.device).repeat_interleave(n)
        self.reorder(index, memory=False)
        self.group *= n

    def reorder(self, index: Tensor, memory: bool = True) -> None:
        """Keep the rows `index` (batch'), in that order: beams follow their parents.

        Beam search moves beams only within a sentence, whose memory is the
        same for all its beams, so it passes `memory=False` and the memory is
        left alone; dropping finished sentences needs `memory=True`, and then
        `index` keeps whole groups: `group` rows for each memory row kept.
        """
        written = self.kv[:, :, :, :, : self.length]
        if len(index) == self.batch_size:
            # Same batch (beams within sentences): gather into a spare buffer and swap, so
            # no step allocates (and page-faults in) a fresh buffer of the whole capacity.
            if self._spare is None:
                self._spare = torch.empty_like(self.kv)
            torch.index_select(written, 2, index, out=self._spare[:, :, :, :, : self.length])
            self.kv, self._spare = self._spare, self.kv
        else:
            kv = self.kv.new_empty(*self.kv.shape[:2], len(index), *self.kv.shape[3:])
            kv[:, :, :, :, : self.length] = written.index_select(2, index)
            self.kv, self._spare = kv, None
        self.key_mask = self.key_mask.index_select(0, index)
        self.n_real = self.n_real.index_select(0, index)
        if memory and self.memory_kv is not None:
            rows = index if self.group == 1 else index[:: self.group] // self.group
            self.memory_kv = self.memory_kv.index_select(2, rows)
            if self.memory_mask is not None:
                self.memory_mask = self.memory_mask.index_select(0, rows)
