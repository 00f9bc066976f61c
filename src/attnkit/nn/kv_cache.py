"""The key-value cache: what a decoder has already computed, kept for the next step.

At step t a causal decoder needs K_{<=t} and V_{<=t} of every layer, but the
keys and values of positions < t do not change (causality), so each step
computes only its own and appends them:

    K_{<=t} = [K_{<t}; x_t W^K],   V_{<=t} = [V_{<t}; x_t W^V]

Cross-attention keys and values depend only on the encoder memory, so they are
computed once per source, and the beams of a sentence share them (`group`).
Buffers are preallocated for the whole decode, so a step writes in place and
never concatenates.

Beam search reorders the rows at every step, each beam continuing a parent's
prefix. Position p of a prefix is written once, at step p, by the row that
decoded it, so no key needs to move: a table `rows` (batch, slots) names the
cache row holding row b's key at position p, and a reorder reorders only that
table. Attention reads through it (`step_attention.attend`) or gathers first
(`HeldKV.gathered`); without the kernel, on a ring, or when the batch outgrows
the cache, the rows are copied instead.

With a sliding window of w keys (Mistral) no query ever looks further back
than w - 1 positions, so the cache is a ring of w slots: position p lives in
slot p mod w, and memory stays w positions however long the decode. Keys are
held in ring order, not position order; attention does not care about the
order of its keys, and the masks and ALiBi's bias are built from the position
held in each slot (`distance`).

The cache holds keys and values and what masks them, nothing of a decoding
policy: the monotonic window (`nn/monotonic.py`), what a pointer-generator copies
from and the alignment that location-aware and monotonic attention carry
(`nn/alignment_state.py`) are the decode's (`attnkit.models.decoding_state`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from attnkit.errors import AttnkitError
from attnkit.kernels import step_attention
from attnkit.nn.masks import causal_mask, padding_mask, self_attention_mask, slot_distance
from attnkit.nn.window import NO_WINDOW, Window


class HeldKV(NamedTuple):
    """A layer's keys and values after `LayerKV.update`, as the cache holds them.

    With `rows` None, k and v are (batch, kv_heads, keys, d_head). Otherwise they
    are the cache's whole buffers (cache rows, kv_heads, slots, d_head) and row b's
    key at position p lies in cache row rows[b, p] (rows: (batch, keys)).
    """

    k: Tensor
    v: Tensor
    rows: Tensor | None = None

    def gathered(self) -> tuple[Tensor, Tensor]:
        """(batch, kv_heads, keys, d_head) keys and values, gathered through `rows` if any."""
        if self.rows is None:
            return self.k, self.v
        return through_rows(self.k, self.rows), through_rows(self.v, self.rows)


def through_rows(held: Tensor, rows: Tensor) -> Tensor:
    """(..., batch, kv_heads, keys, d_head): what `held` (..., cache rows, kv_heads, slots,
    d_head) holds at cache row rows[b, p] and position p, for each row b and position p."""
    positions = torch.arange(rows.shape[1], device=rows.device)
    # Indices around a slice put their dims first: (batch, keys, ..., kv_heads, d_head).
    return held[..., rows, :, positions, :].movedim((0, 1), (-4, -2))


class LayerKV:
    """One layer's view of a `KVCache`, handed to that layer's attention."""

    def __init__(self, cache: KVCache, index: int) -> None:
        self.cache, self.index = cache, index

    def update(self, k: Tensor, v: Tensor) -> HeldKV:
        """Store the new positions' (batch, kv_heads, n, d_head) keys and values.

        Returns the keys and values of every position so far (views, no copy;
        through the cache's `rows` after a reorder), or, on a ring, of every
        position the new queries may see.
        """
        cache = self.cache
        end, n = cache.length, k.shape[2]
        kv = cache.kv[self.index]
        if not cache.ring:
            batch = k.shape[0]  # each row writes its own cache row (see `KVCache.reorder`)
            kv[0, :batch, :, end - n : end] = k
            kv[1, :batch, :, end - n : end] = v
            if cache.rows is not None:
                return HeldKV(kv[0], kv[1], cache.rows[:, :end])
            return HeldKV(kv[0, :, :, :end], kv[1, :, :, :end])
        held = min(end - n, cache.slots)
        if n > 1:
            # The first new queries need keys that this write overwrites: they attend
            # over what the ring held, followed by the new keys (a copy, once per prompt).
            keys, values = (
                torch.cat((kv[0, :, :, :held], k), 2),
                torch.cat((kv[1, :, :, :held], v), 2),
            )
        slots = cache.write_slots
        kv[0].index_copy_(2, slots, k[:, :, n - len(slots) :])
        kv[1].index_copy_(2, slots, v[:, :, n - len(slots) :])
        if n > 1:
            return HeldKV(keys, values)
        filled = min(end, cache.slots)
        return HeldKV(kv[0, :, :, :filled], kv[1, :, :, :filled])

    def memory(self) -> tuple[Tensor, Tensor] | None:
        """The cross-attention keys and values over the memory, when computed."""
        memory_kv = self.cache.memory_kv
        return None if memory_kv is None else (memory_kv[self.index, 0], memory_kv[self.index, 1])


class KVCache:
    """Preallocated self-attention keys and values of every layer, plus cross-attention ones.

    kv: (layers, 2, cache rows, kv_heads, slots, d_head), filled up to `length`;
        slots is the capacity, or fewer on a ring (`Window.cache_slots`); cache rows
        is the batch, or more once the batch has shrunk through `rows`.
    rows: (batch, slots) the cache row holding each row's key at each position,
        after a reorder that moved no keys; None: row b's own.
    key_mask: (batch, slots), True where the key is a real token; left
        padding of prompts stays False, so padded keys are never attended.
    positions_held: (slots,) on a ring, the position whose key each slot holds.
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
        window: Window = NO_WINDOW,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self._capacity = capacity
        slots = window.cache_slots(capacity)
        self.ring = slots < capacity
        self.kv = torch.empty(
            n_layers, 2, batch_size, n_kv_heads, slots, d_head, dtype=dtype, device=device
        )
        self.rows: Tensor | None = None  # beam search's table (module docstring); None: own row
        self.key_mask = torch.zeros(batch_size, slots, dtype=torch.bool, device=device)
        self.positions_held = torch.full((slots,), -1, dtype=torch.long, device=device)
        self.write_slots = torch.empty(0, dtype=torch.long, device=device)
        self._distance: Tensor | None = None
        self.n_real = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.length = 0
        self.n_last = 0
        self.padded = False
        self.memory_kv: Tensor | None = None
        self.memory_mask: Tensor | None = None
        self.mask: Tensor | None = None
        self.group = 1
        self.layers = [LayerKV(self, i) for i in range(n_layers)]

    @property
    def capacity(self) -> int:
        """The most positions this cache decodes."""
        return self._capacity

    @property
    def slots(self) -> int:
        """The positions it holds at once: the capacity, or the window of a ring."""
        return self.kv.shape[4]

    @property
    def batch_size(self) -> int:
        return self.key_mask.shape[0]

    def set_memory(
        self, memory_kv: list[tuple[Tensor, Tensor]], memory_key_mask: Tensor | None
    ) -> None:
        """Keep each layer's cross-attention (keys, values) over the memory, computed once."""
        self.memory_kv = torch.stack([torch.stack(kv) for kv in memory_kv])
        self.memory_mask = None if memory_key_mask is None else padding_mask(memory_key_mask)

    def memory_rows(self, index: Tensor) -> Tensor:
        """The memory rows that the batch rows `index` keep (whole groups: `reorder`)."""
        return index if self.group == 1 else index[:: self.group] // self.group

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
        self.length, self.n_last = end, n
        if key_mask is None:
            steps = torch.arange(n, device=self.n_real.device)
            positions = (self.n_real[:, None] + steps) if self.padded else (start + steps)[None]
            self.n_real += n
        else:
            self.padded = self.padded or not bool(key_mask.all())
            positions = (self.n_real[:, None] + key_mask.long().cumsum(-1) - 1).clamp(min=0)
            self.n_real += key_mask.sum(-1)
        if self.ring:
            self._extend_ring(key_mask, start, end)
        else:
            self.key_mask[:, start:end] = True if key_mask is None else key_mask
            self._distance = None
            if self.padded:
                self.mask = self_attention_mask(self.key_mask[:, :end], n, causal=True)
            else:
                # One new query is the last position: it may attend to every key.
                self.mask = None if n == 1 else causal_mask(n, end, self.kv.device)
        return positions

    def _extend_ring(self, key_mask: Tensor | None, start: int, end: int) -> None:
        """Choose the ring slots of the new positions and describe the keys `update` returns.

        Those keys are what the ring held before, then the new ones, for several
        new positions; the ring after the write, for one.
        """
        new = torch.arange(start, end, device=self.kv.device)
        if len(new) > 1:
            held = min(start, self.slots)
            real = key_mask
            if real is None:
                real = torch.ones(self.batch_size, len(new), dtype=torch.bool, device=new.device)
            keys_at = torch.cat((self.positions_held[:held], new))
            keys_real = torch.cat((self.key_mask[:, :held], real), 1)
        kept = new[-self.slots :]  # a prompt longer than the ring leaves only its end
        self.write_slots = kept % self.slots
        self.positions_held[self.write_slots] = kept
        written = True if key_mask is None else key_mask[:, len(new) - len(kept) :]
        self.key_mask[:, self.write_slots] = written
        if len(new) == 1:
            filled = min(end, self.slots)
            keys_at, keys_real = self.positions_held[:filled], self.key_mask[:, :filled]
        self._distance = new[:, None] - keys_at[None]
        # Causality and the window come from the distances (the stack's local mask);
        # the cache adds padding, and each query's own key for padded queries.
        self.mask = padding_mask(keys_real) | (self._distance == 0) if self.padded else None

    def distance(self) -> Tensor:
        """(new queries, keys) distance from each query of the last `extend` to each key."""
        if self._distance is not None:
            return self._distance
        return slot_distance(self.n_last, self.length, self.kv.device)

    def repeat_rows(self, n: int) -> None:
        """Each row becomes `n` consecutive rows (the beams of a sentence) sharing its memory."""
        index = torch.arange(self.batch_size, device=self.kv.device).repeat_interleave(n)
        self.reorder(index, memory=False)
        self.group *= n

    def _reads_through_rows(self) -> bool:
        """Whether attention reads the keys through `rows` here (else rows are copied)."""
        return self.kv.dtype == torch.float32 and step_attention.runs_on(self.kv.device)

    def _copy_rows(self, index: Tensor) -> None:
        """Reorder by copying the keys and values of the positions written so far."""
        written = self.kv[:, :, :, :, : self.length]
        if self.rows is None and len(index) == self.kv.shape[2]:
            # Same batch (beams within sentences): most beams keep their own parent (about 4
            # in 5 per step in `python -m bench generate`'s beam search), so only the rows that
            # take another row's keys are copied, in place; their sources are gathered first.
            moved = (index != torch.arange(len(index), device=index.device)).nonzero()[:, 0]
            written[:, :, moved] = written.index_select(2, index[moved])
            return
        kv = self.kv.new_empty(*self.kv.shape[:2], len(index), *self.kv.shape[3:])
        if self.rows is None:
            kv[:, :, :, :, : self.length] = written.index_select(2, index)
        else:  # the keys each new row sees, at every position, gathered through the table
            kv[:, :, :, :, : self.length] = through_rows(self.kv, self.rows[index, : self.length])
        self.kv, self.rows = kv, None

    def reorder(self, index: Tensor, memory: bool = True) -> None:
        """Keep the rows `index` (batch'), in that order: beams follow their parents.

        Beam search moves beams only within a sentence, whose memory is the
        same for all its beams, so it passes `memory=False` and the memory is
        left alone; dropping finished sentences needs `memory=True`, and then
        `index` keeps whole groups: `group` rows for each memory row kept.
        """
        if not self.ring and len(index) <= self.kv.shape[2] and self._reads_through_rows():
            # No key moves: each row takes its parent's table below the length, and its own
            # cache row from there on, where it writes next.
            below = self.rows[index, : self.length] if self.rows is not None else index[:, None]
            own = torch.arange(len(index), device=index.device)[:, None]
            self.rows = torch.cat(
                (below.expand(-1, self.length), own.expand(-1, self.slots - self.length)), 1
            )
        else:
            self._copy_rows(index)
        self.key_mask = self.key_mask.index_select(0, index)
        self.n_real = self.n_real.index_select(0, index)
        if memory and self.memory_kv is not None:
            rows = self.memory_rows(index)
            self.memory_kv = self.memory_kv.index_select(2, rows)
            if self.memory_mask is not None:
                self.memory_mask = self.memory_mask.index_select(0, rows)
