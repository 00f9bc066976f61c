"""Paged KV memory: blocks of positions shared by the running rows, read through a block table.

PagedAttention (Kwon et al. 2023, "Efficient Memory Management for Large Language
Model Serving with PagedAttention"): the keys and values of every layer live in
one preallocated pool of blocks of B positions. A row holds a table of block ids,
its position p lying at offset p mod B of block table[p // B]; so a row takes a
block when it needs one and gives its blocks back when it leaves, and memory
follows the tokens in flight (sum over rows of ceil(len / B) blocks), not rows x
max_len. Attention for a decoding step gathers each row's keys through its table:

    slot(b, p) = table[b, p // B] * B + p mod B
    K_b[c] = pool_K[slot(b, c + n_b - (L - 1))]   for c in [0, L), masked where that is < 0

with n_b the position the row writes at this step and L = ceil(max_len / B) * B, so
every row's keys stand right-aligned on L columns (the newest at L - 1, as the dynamic
cache's left-padded rows stand), the distance from the query to column c is L - 1 - c
for every row (ALiBi's and T5's bias), and every shape is fixed. An encoder-decoder's
cross-attention keys and values over each row's source live in a second pool of the
same blocks, left-aligned and masked past the source's length.

A step runs for a fixed set of batch sizes (1, 2, 4, ..., up to the batch's most
rows): the running rows are padded up to the next size, the padding rows pointing at
block 0, which no row holds (their writes land there, their tokens are read by no
one). The tables and counts are tensors of one shape for each size, written in place
before each step, so a compiled step compiles once for each size and rows joining
and leaving never recompile it (`compiled_step`; CUDA graphs on a GPU).

Only single-token steps run here: prompts are run on the dynamic cache
(`attnkit.nn.kv_cache.KVCache`) and their keys copied into blocks (`PagedMemory.add`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnkit.generation.cache_rows import held
from attnkit.models.decoding_state import DecodingState
from attnkit.nn.kv_cache import HeldKV, KVCache
from attnkit.nn.masks import padding_mask

BLOCK = 16  # positions a block holds (vLLM's default)
NULL = 0  # the block padding rows write to and read from; never handed to a row


def sizes(max_batch: int) -> list[int]:
    """The batch sizes a step runs at: 1, 2, 4, ... up to the first that holds `max_batch`."""
    out = [1]
    while out[-1] < max_batch:
        out.append(out[-1] * 2)
    return out


def pool_blocks(max_batch: int, width: int, blocks: int | None) -> int:
    """Blocks a pool hands out: `blocks`, or enough for `max_batch` rows of `width` blocks,
    and never fewer than one whole row's (so that a row alone always fits)."""
    return max(blocks or max_batch * width, width)


class BlockPool:
    """Keys and values of every layer in `blocks` blocks of `block` positions.

    keys, values: a tensor (blocks * block, kv_heads, d_head) for each layer (a tensor of
        its own, so that a compiled step writes only its slots: see `static_cache`).
    free: the ids of the blocks no row holds, block 0 never among them.
    """

    def __init__(
        self,
        layers: int,
        blocks: int,
        block: int,
        kv_heads: int,
        d_head: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.blocks, self.block = blocks, block
        size = blocks * block, kv_heads, d_head
        with torch.inference_mode(False):  # written in place by later steps, in or out of it
            made = [torch.zeros(size, dtype=dtype, device=device) for _ in range(2 * layers)]
        self.keys, self.values = made[:layers], made[layers:]
        for buffer in made:
            torch._dynamo.mark_static_address(buffer)
        self.free = list(range(blocks - 1, NULL, -1))  # popped from the end: lowest first

    @property
    def in_use(self) -> int:
        """Blocks held by rows."""
        return self.blocks - 1 - len(self.free)

    def take(self, n: int) -> list[int]:
        """`n` free blocks for a row (the pool is sized so that they are always there)."""
        if n > len(self.free):
            raise RuntimeError(f"{n} blocks asked and {len(self.free)} free")
        return [self.free.pop() for _ in range(n)]

    def give(self, blocks: list[int]) -> None:
        """A leaving row's blocks, free again."""
        self.free.extend(reversed(blocks))

    def write(self, blocks: list[int], kv: Tensor) -> None:
        """Keys and values (layers, 2, kv_heads, n, d_head) at positions 0..n-1 of `blocks`."""
        slots = _slots(torch.tensor(blocks, device=kv.device)[None], kv.shape[3], self.block)[0]
        for layer in range(kv.shape[0]):
            self.keys[layer].index_copy_(0, slots, kv[layer, 0].transpose(0, 1))
            self.values[layer].index_copy_(0, slots, kv[layer, 1].transpose(0, 1))


def _slots(table: Tensor, n: int, block: int) -> Tensor:
    """(rows, n) pool slots of positions 0..n-1 through `table` (rows, blocks)."""
    positions = torch.arange(n, device=table.device)
    return table[:, positions // block] * block + positions % block


@dataclass(eq=False)
class PagedRow:
    """One row's blocks: its keys' (`length` positions held) and its source's, if any."""

    blocks: list[int] = field(default_factory=list)
    length: int = 0
    source: list[int] = field(default_factory=list)
    source_length: int = 0


class PagedLayerKV:
    """One layer's view of a `PagedKVCache`, handed to that layer's attention."""

    def __init__(self, cache: PagedKVCache, index: int) -> None:
        self.cache, self.index = cache, index

    def update(self, k: Tensor, v: Tensor) -> HeldKV:
        """Write each row's new key at its slot; return its keys gathered through its table,
        right-aligned (batch, kv_heads, L, d_head)."""
        cache, pool = self.cache, self.cache.memory.pool
        keys, values = pool.keys[self.index], pool.values[self.index]
        keys.index_copy_(0, cache.written, k[:, :, 0])
        values.index_copy_(0, cache.written, v[:, :, 0])
        return HeldKV(keys[cache.read].transpose(1, 2), values[cache.read].transpose(1, 2))

    def memory(self) -> tuple[Tensor, Tensor] | None:
        """Cross-attention's keys and values over each row's source, gathered (batch, kv_heads,
        S, d_head), or None for a decoder."""
        sources = self.cache.memory.sources
        if sources is None:
            return None
        read = self.cache.source_read
        keys, values = sources.keys[self.index], sources.values[self.index]
        return keys[read].transpose(1, 2), values[read].transpose(1, 2)


class PagedKVCache:
    """What a decoding step of `batch` rows reads: fixed tensors, written before each step.

    table: (batch, blocks a row may hold) each row's block ids; NULL past its blocks.
    n_real: (batch,) positions each row holds: where it writes next, and its position.
    source_table, source_length: the same for an encoder-decoder's sources.
    It answers the calls the model's layers make of `attnkit.nn.kv_cache.KVCache`
    (`extend`, each layer's `update` and `memory`, `mask`, `memory_mask`, `distance`).
    """

    ring = False
    group = 1

    def __init__(self, memory: PagedMemory, batch: int) -> None:
        self.memory = memory
        device = memory.device
        with torch.inference_mode(False):
            self.table = torch.zeros(batch, memory.width, dtype=torch.long, device=device)
            self.n_real = torch.zeros(batch, dtype=torch.long, device=device)
            self.source_table = torch.zeros(
                batch, memory.source_width, dtype=torch.long, device=device
            )
            self.source_length = torch.ones(batch, dtype=torch.long, device=device)
        for buffer in (self.table, self.n_real, self.source_table, self.source_length):
            torch._dynamo.mark_static_address(buffer)
        self.columns = memory.width * memory.block
        self.mask: Tensor | None = None
        self.memory_mask: Tensor | None = None
        self.written = self.read = self.source_read = self.n_real  # slots: each `extend` sets them
        self.layers = [PagedLayerKV(self, i) for i in range(memory.layers)]
        # what the model's `decode_step` takes: an encoder-decoder's state holds the cache
        self.state: PagedKVCache | DecodingState = (
            DecodingState(self) if memory.sources is not None else self
        )

    @property
    def batch_size(self) -> int:
        return self.table.shape[0]

    def extend(self, key_mask: Tensor | None, n: int) -> Tensor:
        """Take each row's next position for one new token; return the positions (batch, 1).

        Sets the slots the layers write (`written`) and read (`read`, the module's
        equation), `mask` (batch, 1, 1, L) and, for an encoder-decoder, `memory_mask`.
        """
        if n != 1:
            raise ValueError("a paged cache decodes one token a row a step; prompts run apart")
        block, columns = self.memory.block, self.columns
        n_real = self.n_real
        here = self.table.gather(1, (n_real // block)[:, None])[:, 0]
        self.written = here * block + n_real % block
        position = torch.arange(columns, device=n_real.device)[None] + (n_real[:, None] - columns)
        position = position + 1  # column L - 1 holds the new key, at position n_real
        seen = position >= 0
        position = position.clamp(min=0)
        self.read = self.table.gather(1, position // block) * block + position % block
        self.mask = padding_mask(seen)
        if self.memory.sources is not None:
            source = self.memory.source_width * block
            self.source_read = _slots(self.source_table, source, block)
            at = torch.arange(source, device=n_real.device)
            self.memory_mask = padding_mask(at[None] < self.source_length[:, None])
        positions = n_real[:, None].clone()
        self.n_real += 1
        return positions

    def distance(self) -> Tensor:
        """(1, L) distance from the new query (column L - 1) to each column's key."""
        return (self.columns - 1 - torch.arange(self.columns, device=self.n_real.device))[None]


class PagedMemory:
    """The paged memory of one model's running rows: the pools, each row's blocks, and a
    `PagedKVCache` for each batch size a step runs at."""

    def __init__(
        self,
        model: nn.Module,
        cache: KVCache,
        max_batch: int,
        block: int = BLOCK,
        compiled: bool = True,
        blocks: int | None = None,
    ) -> None:
        """Pools of `blocks` blocks each (`pool_blocks`), their shapes a prefill's `cache`'s
        (layers, heads, dtype, device); steps at the sizes up to `max_batch`, compiled or eager."""
        self.model = model
        layers, _, _, kv_heads, _, d_head = cache.kv.shape
        self.layers, self.block, self.device = layers, block, cache.kv.device
        self.max_len = model.config.max_len
        self.width = math.ceil(self.max_len / block)
        dtype = cache.kv.dtype
        count = pool_blocks(max_batch, self.width, blocks) + 1  # and block 0
        self.pool = BlockPool(layers, count, block, kv_heads, d_head, dtype, self.device)
        self.sources: BlockPool | None = None
        self.source_width = 1
        if cache.memory_kv is not None:  # an encoder-decoder: its sources' keys, in blocks too
            _, _, _, source_heads, _, source_d = cache.memory_kv.shape
            self.source_width = self.width
            self.sources = BlockPool(layers, count, block, source_heads, source_d, dtype,
                                     self.device)  # fmt: skip
        self.sizes = sizes(max_batch)
        self.steps: dict[int, PagedKVCache] = {}
        self.step = compiled_step(self) if compiled else step

    def add(self, cache: KVCache) -> list[PagedRow]:
        """Copy the rows of a prefill's `cache` into blocks of their own; one `PagedRow` each."""
        kv, mask = held(cache)
        rows = []
        for b in range(cache.batch_size):
            real = mask[b]
            row = PagedRow(length=int(real.sum()))
            row.blocks = self.pool.take(math.ceil(row.length / self.block))
            self.pool.write(row.blocks, kv[:, :, b][:, :, :, real])
            if self.sources is not None:
                memory = cache.memory_kv[:, :, b]
                if cache.memory_mask is not None:
                    memory = memory[:, :, :, cache.memory_mask[b, 0, 0]]
                row.source_length = memory.shape[3]
                row.source = self.sources.take(math.ceil(row.source_length / self.block))
                self.sources.write(row.source, memory)
            rows.append(row)
        return rows

    def leave(self, row: PagedRow) -> None:
        """A row has left: its blocks go back to the pools."""
        self.pool.give(row.blocks)
        row.blocks = []
        if self.sources is not None:
            self.sources.give(row.source)
            row.source = []

    def step_cache(self, rows: list[PagedRow]) -> PagedKVCache:
        """The cache of the smallest size that holds `rows`, its tables and counts theirs (the
        padding rows' on block 0), each row given the block its next position needs."""
        for row in rows:
            if row.length // self.block >= len(row.blocks):
                row.blocks += self.pool.take(1)
        size = next(s for s in self.sizes if s >= len(rows))
        cache = self.steps.get(size)
        if cache is None:
            cache = self.steps[size] = PagedKVCache(self, size)
        pad = size - len(rows)
        table = [r.blocks + [NULL] * (self.width - len(r.blocks)) for r in rows]
        table += [[NULL] * self.width] * pad
        cache.table.copy_(torch.tensor(table))
        cache.n_real.copy_(torch.tensor([r.length for r in rows] + [0] * pad))
        if self.sources is not None:
            source = [r.source + [NULL] * (self.source_width - len(r.source)) for r in rows]
            source += [[NULL] * self.source_width] * pad
            cache.source_table.copy_(torch.tensor(source))
            cache.source_length.copy_(torch.tensor([r.source_length for r in rows] + [1] * pad))
        for row in rows:
            row.length += 1
        return cache

    def decode(self, rows: list[PagedRow], last: list[int]) -> Tensor:
        """Logits (rows, vocab) of one step of `rows`, fed their `last` tokens."""
        cache = self.step_cache(rows)
        ids = torch.zeros(cache.batch_size, 1, dtype=torch.long)
        ids[: len(rows), 0] = torch.tensor(last)
        torch.compiler.cudagraph_mark_step_begin()  # the last step's logits have been read
        return self.step(self.model, ids.to(self.device), cache.state)[: len(rows)]


def step(model: nn.Module, ids: Tensor, state: PagedKVCache | DecodingState) -> Tensor:
    """One decoding step of `model` on a paged cache (what `compiled_step` compiles)."""
    return model.decode_step(ids, state)


def compiled_step(memory: PagedMemory) -> Callable[[nn.Module, Tensor, PagedKVCache], Tensor]:
    """`step` compiled with each batch size's shapes fixed (CUDA graphs on a GPU): a graph for
    each of `memory`'s sizes. Every memory's graphs are one function's, so dynamo's limit of
    graphs a function (8) is raised to hold them all rather than fall back to eager."""
    global _graphs
    _graphs += len(memory.sizes)
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, _graphs)
    return _compiled()


_graphs = 0  # the graphs the memories made so far may ask for


@functools.cache
def _compiled() -> Callable:
    return torch.compile(step, mode="reduce-overhead", fullgraph=True, dynamic=False)
