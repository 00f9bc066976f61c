"""Rows joining and leaving a running KV cache: the memory of iteration-level batching.

Sequences that started at different steps share one cache by standing
right-aligned on its slots, each left-padded:

    slot      0     1     2     3     4        (length 5)
    row a     a0    a1    a2    a3    a4       started first
    row b     -     -     b0    b1    b2       joined two steps later
    row c     -     -     -     c0    c1

Each row's positions are counted over its own real tokens (`KVCache.n_real`), and
padding keys are masked (`KVCache.key_mask`), so a row attends to exactly what it
would attend to alone: decoding stays padding-invariant, and a row's output does
not depend on its companions. A step writes one new slot for every row at once.

`join` stacks caches so (a new prefill beside the running batch); `compact`
drops the leading slots that no row uses any more (after the oldest rows left),
so the cache never grows past the longest row still running, and gives it room
for the next step, doubling its capacity up to the model's `max_len` as it needs.
A row leaves through the cache's own `reorder`.

These functions know `KVCache`'s layout (`attnkit.nn.kv_cache`): the cache of a
sliding window (a ring), a pointer-generator's copy source, the alignments that
location-aware and monotonic attention carry, a monotonic window and beam groups
are not supported here (`joinable` tells the models whose are not).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.config import ModelConfig
from attnkit.nn.kv_cache import KVCache, through_rows
from attnkit.nn.masks import padding_mask


def joinable(config: ModelConfig) -> bool:
    """Whether a model's decoding caches can take rows mid-way: not a window's (a ring, or
    a strided pattern over slots), not a pointer-generator's (a copy source), not one whose
    cross-attention carries each row's alignment over its own source (location-aware or
    monotonic attention)."""
    return (
        not config.attention_window
        and config.copy_attention == "none"
        and config.attention_kind not in ("location-aware", "monotonic")
    )


def held(cache: KVCache) -> tuple[Tensor, Tensor]:
    """(layers, 2, batch, kv_heads, length, d_head) keys and values of each row, in row order,
    and its (batch, length) key mask: what the cache holds, read through its row table."""
    length, batch = cache.length, cache.batch_size
    if cache.rows is not None:
        kv = through_rows(cache.kv, cache.rows[:, :length])
    else:
        kv = cache.kv[:, :, :batch, :, :length]
    return kv, cache.key_mask[:, :length]


def join(caches: list[KVCache], max_len: int) -> KVCache:
    """One cache holding the rows of `caches` in order, right-aligned, with room to grow
    (twice the longest cache's length, up to `max_len`)."""
    first = caches[0]
    length = max(c.length for c in caches)
    capacity = min(max(2 * (length + 1), *(c.capacity for c in caches)), max_len)
    layers, _, _, kv_heads, _, d_head = first.kv.shape
    batch = sum(c.batch_size for c in caches)
    out = KVCache(
        layers,
        batch,
        kv_heads,
        d_head,
        max(capacity, length),
        dtype=first.kv.dtype,
        device=first.kv.device,
    )
    out.kv.zero_()  # padding keys are masked, but a NaN of empty memory would still poison sums
    row = 0
    for cache in caches:
        kv, mask = held(cache)
        rows = slice(row, row + cache.batch_size)
        out.kv[:, :, rows, :, length - cache.length : length] = kv
        out.key_mask[rows, length - cache.length : length] = mask
        row += cache.batch_size
    out.n_real = torch.cat([c.n_real for c in caches])
    out.length = length
    out.padded = True
    if first.memory_kv is not None:
        _join_memory(out, caches)
    return out


def _join_memory(out: KVCache, caches: list[KVCache]) -> None:
    """Each row's cross-attention keys and values over its own source, the sources padded on
    the right to the longest and the padding masked."""
    sources = max(c.memory_kv.shape[4] for c in caches)
    parts, masks = [], []
    for cache in caches:
        memory, n = cache.memory_kv, cache.memory_kv.shape[4]
        parts.append(torch.nn.functional.pad(memory, (0, 0, 0, sources - n)))
        real = torch.ones(cache.batch_size, n, dtype=torch.bool, device=memory.device)
        if cache.memory_mask is not None:
            real = cache.memory_mask[:, 0, 0]
        masks.append(torch.nn.functional.pad(real, (0, sources - n), value=False))
    out.memory_kv = torch.cat(parts, dim=2)
    out.memory_mask = padding_mask(torch.cat(masks))


def compact(cache: KVCache, max_len: int) -> KVCache:
    """`cache` without the leading slots no row uses, with room for one more step: the same
    cache when it has both, else a new one (capacity doubled as needed, up to `max_len`)."""
    kv, mask = held(cache)
    used = mask.any(0)
    start = int(used.nonzero()[0]) if bool(used.any()) else cache.length
    room = cache.length < cache.capacity
    if cache.rows is None and room and start < max(cache.length // 2, 1):
        return cache  # not worth a copy yet
    length = cache.length - start
    capacity = min(max(cache.capacity, 2 * (length + 1)), max_len)
    out = KVCache(
        kv.shape[0],
        cache.batch_size,
        kv.shape[3],
        kv.shape[5],
        capacity,
        dtype=kv.dtype,
        device=kv.device,
    )
    out.kv.zero_()
    out.kv[:, :, :, :, :length] = kv[:, :, :, :, start:]
    out.key_mask[:, :length] = mask[:, start:]
    out.n_real, out.length, out.padded = cache.n_real, length, True
    out.memory_kv, out.memory_mask = cache.memory_kv, cache.memory_mask
    return out
