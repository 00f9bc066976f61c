"""Which rows may join paged memory: the blocks promised to the rows of each model.

A pool of blocks (`paged_cache`) is allocated once, and may hold fewer blocks than
`max_batch` rows of max_len positions (`kv_blocks`). A row takes blocks as its
tokens come, so a pool could run dry mid-way; instead each row is promised, as it
is admitted, the blocks its longest output may hold,

    need = ceil(min(prompt + max_new_tokens, max_len) / B)      (a decoder's row)

(an encoder-decoder's: its output's in one pool, its source's in the other), and a
row joins only while the promises fit the pools; the others wait for rows to leave
(the reservation of early continuous batching servers; vLLM preempts instead). The
memory in use is what the rows hold, sum over rows of ceil(length / B); the promises
only decide who joins.
"""

from __future__ import annotations

import math
from typing import Any

from attnkit.config import ModelConfig
from attnkit.generation.paged_cache import PagedMemory, PagedRow, pool_blocks
from attnkit.nn.kv_cache import KVCache


class Ledger:
    """The blocks a model's rows may come to hold, promised as they are admitted.

    A row is promised, as it joins, the blocks its longest output needs (its prompt, or its
    source, and max_new_tokens, up to max_len); it takes them one by one as its tokens come.
    Rows join only while the promises fit the pools, so a pool never runs dry, and a pool
    smaller than `max_batch` rows of max_len still decodes every row, the others waiting.
    """

    def __init__(self, config: ModelConfig, max_batch: int, block: int, blocks: int | None):
        self.config, self.block = config, block
        self.width = math.ceil(config.max_len / block)
        self.free = pool_blocks(max_batch, self.width, blocks)
        self.source_free = self.free if config.shape == "encoder-decoder" else 0
        self.promises: dict[object, tuple[int, int]] = {}
        self.first: object | None = None  # the row that waits longest for blocks, if any

    def need(self, prompt: int, max_new_tokens: int) -> tuple[int, int]:
        """Blocks of keys and of a source a row of `prompt` tokens may hold."""
        max_len, block = self.config.max_len, self.block
        if self.config.shape == "decoder":
            return math.ceil(min(prompt + max_new_tokens, max_len) / block), 0
        tokens = min(1 + max_new_tokens, max_len)  # the start token and the output
        return math.ceil(tokens / block), math.ceil(min(prompt, max_len) / block)

    def promise(self, row: object, prompt: int, max_new_tokens: int) -> bool:
        """Promise `row` its blocks if they fit beside the others' promises and no row came
        before it that still waits for blocks (first come, first served: a long row is not
        passed over forever by short ones; a row alone always fits)."""
        first = self.first
        if first is not None and first is not row and not getattr(first, "cancelled", False):
            return False
        keys, source = self.need(prompt, max_new_tokens)
        if keys > self.free or source > self.source_free:
            self.first = row
            return False
        self.first = None
        self.free, self.source_free = self.free - keys, self.source_free - source
        self.promises[row] = keys, source
        return True

    def release(self, row: object) -> None:
        """`row` has left (or never joined): its promise goes back."""
        keys, source = self.promises.pop(row, (0, 0))
        self.free, self.source_free = self.free + keys, self.source_free + source


class PagedModels:
    """Each served model's ledger and paged memory, kept while a scheduler runs: the compiled
    steps' CUDA graphs replay on the pools' addresses, so the pools outlive the batches."""

    def __init__(self, max_batch: int, block: int, blocks: int | None) -> None:
        self.max_batch, self.block, self.blocks = max_batch, block, blocks
        self.kept: dict[int, list] = {}  # id(served): [served, its ledger, its memory or None]

    def _kept(self, served: Any) -> list:
        kept = self.kept.get(id(served))
        if kept is None or kept[0] is not served:
            ledger = Ledger(served.model.config, self.max_batch, self.block, self.blocks)
            kept = self.kept[id(served)] = [served, ledger, None]
        return kept

    def admit(self, sequence: Any) -> bool:
        """Whether `sequence` (a `rows.Sequence`) may join its model's paged rows now; if so
        its blocks are promised until `release`."""
        ledger = self._kept(sequence.model)[1]
        return ledger.promise(sequence, len(sequence.prompt), sequence.config.max_new_tokens)

    def release(self, sequence: Any) -> None:
        """`sequence` has left its model's paged rows, or never joined them."""
        self._kept(sequence.model)[1].release(sequence)

    def memory(self, served: Any, cache: KVCache) -> PagedMemory:
        """The paged memory of `served`'s rows, made at its first prefill (`cache`'s shapes)."""
        kept = self._kept(served)
        if kept[2] is None:
            kept[2] = PagedMemory(
                served.model, cache, self.max_batch, self.block, blocks=self.blocks
            )
        return kept[2]

    def leave(self, sequence: Any, row: PagedRow) -> None:
        """A row leaves: its blocks go back to the pool, its promise to the ledger."""
        self._kept(sequence.model)[2].leave(row)
        self.release(sequence)

    def memories(self) -> list[PagedMemory]:
        """The memories made so far."""
        return [kept[2] for kept in self.kept.values() if kept[2] is not None]
