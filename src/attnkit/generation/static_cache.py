"""A static KV cache: every tensor keeps its shape and its address from step to step.

A decoding step of a small model on a GPU costs mostly the launch of its many
small kernels (about 5 ms a token for GPT-2 small, whatever the batch). Captured
once as a CUDA graph and replayed, the step costs one launch; but a graph
replays the same kernels on the same memory, so nothing in it may change shape
or move: not the keys held, not the mask, not the position. gpt-fast's answer,
taken here: keys and values of all `capacity` positions in buffers allocated
once, written in place at the step's slot s, and attention over every slot,

    K[:, :, s] <- k_t,   V[:, :, s] <- v_t,
    mask[b, j] = real[b, j] and j <= s      (slots not yet written are masked)
                 or j = s                  (a padding query sees its own key)

so only tensor values change between steps (the slot, the mask, each row's
count of real tokens). Rows never leave: a finished row decodes on, and its
tokens are set to padding by the caller. Beam search reorders the rows in
place between steps (each beam copies its parent's keys), so the buffers keep
their addresses; they are marked as static addresses, so torch.compile's CUDA
graphs may write them in place. Each layer's keys and values are tensors of their
own, not slices of one buffer: compiled, a write into a slice rewrote the whole
buffer at every layer, which made a step cost the cache's size times the layers
(on an H100, GPT-2 small at batch 64 ran 0.47x transformers, 6.22x since; `python -m bench
static-step`, a 4-layer decoder with 128 MiB of keys and values on a 2-core CPU:
277 ms a compiled step, against 12 ms with a tensor for each).

On a GPU the buffers also outlive the decoding: `release` (the decoding state
calls it at the end of `generate`) keeps them for the next decoding of the same
shape, which takes them zeroed, so the CUDA graph recorded on their addresses
replays. Fresh buffers each call would have torch.compile's CUDA graph trees
record one more graph a call (a capture and a device synchronisation), keep it,
and check it at every later step; some torch versions also count these
re-recordings toward a limit (128), past which the step runs without a graph.
`release_all` frees what is kept: at most `KEEP` shapes, the last used. On a CPU,
where no graph is replayed, nothing is kept.

It answers the same calls as `attnkit.nn.kv_cache.KVCache` (`extend`, each
layer's `update` and `memory`), for the models without a ring window, and for
an encoder-decoder's decode without a monotonic window, copying or alignments
carried from step to step (location-aware or monotonic attention: `supports`);
`static_like` takes over a cache the model made (a `KVCache`, or the
`DecodingState` holding one), with its cross-attention keys and values.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnkit.models.decoding_state import DecodingState
from attnkit.nn.kv_cache import HeldKV, KVCache
from attnkit.nn.masks import padding_mask


def chosen(asked: str, device: torch.device | str) -> str:
    """The cache `cache_implementation` asks for on `device`: `auto` is `static` on a CUDA
    device, where a step replayed as a CUDA graph costs one launch instead of hundreds
    (8x the dynamic cache's tokens a second for GPT-2 small at batch 1 on an H200), and
    `dynamic` elsewhere: on a CPU a compiled step gains little and its compilation costs
    seconds at every new shape. A model or a decode the static cache does not serve
    (`supports`, a decode that slides past max_len) decodes on the dynamic one all the same."""
    if asked != "auto":
        return asked
    return "static" if torch.device(device).type == "cuda" else "dynamic"


def supports(cache: KVCache | DecodingState) -> bool:
    """Whether a static cache can stand in for `cache`'s keys and values: no ring, and for an
    encoder-decoder's decode no window focus, copy source or carried alignment beside them."""
    if isinstance(cache, DecodingState):
        if any(p is not None for p in (cache.window, cache.source, cache.alignment)):
            return False
        cache = cache.kv_cache
    return not cache.ring


def static_like(cache: KVCache | DecodingState) -> StaticKVCache | DecodingState:
    """`cache` (which `supports`) with an empty `StaticKVCache` in place of its keys and values."""
    if isinstance(cache, DecodingState):
        return DecodingState(StaticKVCache.from_cache(cache.kv_cache))
    return StaticKVCache.from_cache(cache)


def release(cache: StaticKVCache | DecodingState) -> None:
    """`StaticKVCache.release` of `cache`, or of the one a `DecodingState` holds."""
    (cache.kv_cache if isinstance(cache, DecodingState) else cache).release()


class StaticLayerKV:
    """One layer's view of a `StaticKVCache`, handed to that layer's attention."""

    def __init__(self, cache: StaticKVCache, index: int) -> None:
        self.cache, self.index = cache, index

    def update(self, k: Tensor, v: Tensor) -> HeldKV:
        """Write the new positions' keys and values at their slots; return every slot's."""
        keys, values = self.cache.keys[self.index], self.cache.values[self.index]
        keys.index_copy_(2, self.cache.slots_written, k)
        values.index_copy_(2, self.cache.slots_written, v)
        return HeldKV(keys, values)

    def memory(self) -> tuple[Tensor, Tensor] | None:
        memory_kv = self.cache.memory_kv
        return None if memory_kv is None else (memory_kv[self.index, 0], memory_kv[self.index, 1])


class StaticKVCache:
    """Self-attention keys and values of every layer in fixed buffers, and cross-attention's.

    keys, values: a tensor (batch, kv_heads, capacity, d_head) for each layer, slot p
        holding position p of the (left-padded) sequence; read whole at every step, under
        `mask`.
    key_mask: (batch, capacity) True where a real token's key has been written.
    n_real: (batch,) real tokens so far: the next token's position.
    slot: () the next slot to write.
    memory_kv, memory_mask, group: as `KVCache`'s (an encoder-decoder's memory).
    """

    ring = False

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
        self.capacity = capacity
        device = torch.empty(0, device=device).device  # "cuda" as "cuda:0": one key a device
        self._use(_take(Shape(n_layers, batch_size, n_kv_heads, capacity, d_head, dtype, device)))
        self.slots = torch.arange(capacity, device=device)
        self.slots_written = self.slot[None]
        self.mask: Tensor | None = None
        self.memory_kv: Tensor | None = None
        self.memory_mask: Tensor | None = None
        self.group = 1
        self.layers = [StaticLayerKV(self, i) for i in range(n_layers)]

    def _use(self, held: Buffers) -> None:
        self._held: Buffers | None = held
        self.keys, self.values = held.keys, held.values
        self.key_mask, self.n_real, self.slot = held.key_mask, held.n_real, held.slot

    def release(self) -> None:
        """This cache is done with: its buffers go to the next decoding of its shape.

        Its fields are emptied, so that a step after the release fails rather than write
        into another decoding's buffers.
        """
        if self._held is not None:
            _give_back(self._held)
            self._held = None
            self.keys, self.values = [], []
            self.key_mask = self.n_real = self.slot = None

    @classmethod
    def from_cache(cls, cache: KVCache) -> StaticKVCache:
        """An empty static cache of `cache`'s size, with its cross-attention keys and values."""
        layers, _, batch, kv_heads, capacity, d_head = cache.kv.shape
        static = cls(
            layers, batch, kv_heads, d_head, capacity, dtype=cache.kv.dtype, device=cache.kv.device
        )
        static.memory_kv, static.memory_mask, static.group = (
            cache.memory_kv,
            cache.memory_mask,
            cache.group,
        )
        return static

    @property
    def batch_size(self) -> int:
        return self.key_mask.shape[0]

    def extend(self, key_mask: Tensor | None, n: int) -> Tensor:
        """Take the next `n` slots for new tokens; return their positions (batch, n).

        Sets `mask` (batch, 1, n, capacity): query i sees the real keys up to its own slot.
        """
        written = self.slot + torch.arange(n, device=self.slot.device)
        real = torch.ones_like(self.key_mask[:, :n]) if key_mask is None else key_mask
        self.key_mask.index_copy_(1, written, real)
        positions = self.n_real[:, None] + real.long().cumsum(-1) - 1
        self.n_real += real.sum(-1)
        self.slots_written = written
        causal = self.slots[None, :] <= written[:, None]  # (n, capacity)
        # A padding query (left padding of a prompt) sees its own key, so no row is empty.
        own = self.slots[None, :] == written[:, None]
        self.mask = (padding_mask(self.key_mask) & causal[None, None]) | own[None, None]
        self.slot += n
        return positions.clamp(min=0)

    def repeat_rows(self, n: int) -> None:
        """Each row becomes `n` consecutive rows (the beams of a sentence) sharing its memory.

        Buffers of the new row count (those a decoding of that shape left, if any), and the
        sentences' kept (they may be a greedy decoding's of that shape): beam search calls it
        once, after the prefix and before any compiled step.
        """
        index = torch.arange(self.batch_size, device=self.slot.device).repeat_interleave(n)
        before = self._held
        after = _take(dataclasses.replace(before.shape, batch=len(index)))
        *by_row, slot = before.tensors()  # keys, values, key_mask and n_real have a row each
        for old, new in zip(by_row, after.tensors()[:-1], strict=True):
            new.copy_(old.index_select(0, index))
        after.slot.copy_(slot)
        self._use(after)
        _give_back(before)
        self.group *= n

    def reorder(self, index: Tensor, memory: bool = False) -> None:
        """Row b takes row index[b]'s keys and values (a beam its parent's), in place.

        Every row stays (`index` names one source row for each), so a sentence's
        memory, shared by its beams, never moves and `memory` must be False.
        """
        if memory or len(index) != self.batch_size:
            raise ValueError("rows never leave a static cache: reorder all of them, in place")
        for held in (*self.keys, *self.values):
            held.copy_(held.index_select(0, index))
        self.key_mask.copy_(self.key_mask.index_select(0, index))
        self.n_real.copy_(self.n_real.index_select(0, index))

    def distance(self) -> Tensor:
        """(new queries, capacity) distance from each new query's slot to each slot."""
        return self.slots_written[:, None] - self.slots[None, :]


@dataclasses.dataclass(frozen=True)
class Shape:
    """What makes two decodings' buffers interchangeable."""

    layers: int
    batch: int
    kv_heads: int
    capacity: int
    d_head: int
    dtype: torch.dtype
    device: torch.device


@dataclasses.dataclass
class Buffers:
    """A decoding's keys and values of each layer, `key_mask`, `n_real` and `slot`: the
    tensors a compiled step writes in place (`StaticKVCache` names them)."""

    shape: Shape
    keys: list[Tensor]
    values: list[Tensor]
    key_mask: Tensor
    n_real: Tensor
    slot: Tensor

    @classmethod
    def new(cls, shape: Shape) -> Buffers:
        size = shape.batch, shape.kv_heads, shape.capacity, shape.d_head
        made = functools.partial(torch.zeros, dtype=shape.dtype, device=shape.device)
        # Never inference tensors, which a later decoding outside inference_mode could not
        # write; ordinary tensors are written in place under inference_mode too.
        with torch.inference_mode(False):
            buffers = cls(
                shape,
                [made(size) for _ in range(shape.layers)],
                [made(size) for _ in range(shape.layers)],
                torch.zeros(shape.batch, shape.capacity, dtype=torch.bool, device=shape.device),
                torch.zeros(shape.batch, dtype=torch.long, device=shape.device),
                torch.zeros((), dtype=torch.long, device=shape.device),
            )
        for buffer in buffers.tensors():
            torch._dynamo.mark_static_address(buffer)
        return buffers

    def tensors(self) -> tuple[Tensor, ...]:
        return (*self.keys, *self.values, self.key_mask, self.n_real, self.slot)


# Shapes kept, the last released: a greedy decoding and a beam search (its sentences' rows
# for the prefix, then its beams') may take turns.
KEEP = 3
REUSED_ON = frozenset({"cuda"})  # device types where a step replays a graph on the buffers
_kept: collections.OrderedDict[Shape, Buffers] = collections.OrderedDict()
# Decodings in several threads each take buffers of their own. Reentrant: an abandoned
# stream's release may run in a garbage collection that starts while the lock is held.
_lock = threading.RLock()


def _take(shape: Shape) -> Buffers:
    """Buffers of `shape`, zeroed: those an ended decoding left, else new ones."""
    with _lock:
        held = _kept.pop(shape, None)
    if held is None:
        return Buffers.new(shape)
    for buffer in held.tensors():
        buffer.zero_()
    return held


def _give_back(held: Buffers) -> None:
    if held.shape.device.type not in REUSED_ON:
        return
    if any(buffer.requires_grad for buffer in held.tensors()):
        return  # a decoding under autograd: keeping its buffers would keep its graph alive
    with _lock:
        _kept[held.shape] = held
        _kept.move_to_end(held.shape)
        while len(_kept) > KEEP:
            _kept.popitem(last=False)


def release_all() -> None:
    """Free the buffers kept for later decodings (their memory goes back to the device)."""
    with _lock:
        _kept.clear()


def compiled_step(model: nn.Module) -> Callable[[Tensor, StaticKVCache], Tensor]:
    """`model.decode_step` compiled for one new token a row on a `StaticKVCache`: one graph,
    replayed as a CUDA graph on a GPU (`reduce-overhead`)."""
    return functools.partial(_compiled(type(model)), model)


@functools.cache
def _compiled(kind: type) -> Callable:
    # Compiled once per model class, with the model an argument (torch.compile keeps a graph
    # for each model it meets), so that no cache here holds a model alive.
    return torch.compile(kind.decode_step, mode="reduce-overhead", fullgraph=True)
