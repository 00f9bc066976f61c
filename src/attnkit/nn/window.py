"""The attention window: which keys a query reaches, and what that implies for running it.

A window of w keys lets query i see the keys j with |i - j| < w (i - j < w
when causal: Mistral, Longformer); a stride s adds those with i - j a multiple
of s (the Sparse Transformer's strided pattern, Child et al. 2019).

An encoder's window may add two more kinds of keys (`extra_keys`):
global tokens, the first g positions, which attend to every position and
which every position attends to (Longformer, Beltagy et al. 2020: its [CLS]
and question tokens; BigBird's ITC global blocks), and BigBird's random
blocks (Zaheer et al. 2020): the positions cut into blocks of w, each block of
queries also sees r blocks of keys drawn at random, a draw fixed per layer
(seeded by the layer's index) so a model computes the same function at every
call. Unlike BigBird's, a draw may land on a block the window already covers.

`Window` is the one place that decides what a window implies: whether a
sequence runs block by block (`local_attention`) or under the window as a
mask, and how many keys a decoding cache must hold (a ring of w slots).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import Tensor

# Below these many positions the mask (full attention) is as fast as the blocks or faster
# (bench/bench_window.py: a window of 32 alone 0.69x at 128 positions, 1.02x at 256, 2.03x at
# 512; a window and a stride of 32, 0.45x at 256, 1.21x at 512, 1.73x at 1,024).
BLOCKWISE_MIN_LENGTH = 256
STRIDED_MIN_LENGTH = 512
# Layer l of a stack draws its random blocks from a generator seeded with RANDOM_SEED + l.
RANDOM_SEED = 20_200_728


class Window(NamedTuple):
    """The reach of local attention: `size` keys (0: every key), plus every `stride`-th key,
    plus (encoders) `global_tokens` global positions and `random_blocks` random blocks.

    A named tuple rather than a dataclass: torch.compile (2.11) builds a tuple it meets
    inside a graph, and cannot build a dataclass there."""

    size: int = 0
    stride: int = 0
    global_tokens: int = 0
    random_blocks: int = 0

    def runs_blockwise(self, length: int) -> bool:
        """Whether the window over `length` positions pays for `local_attention`.

        Global and random keys run under the mask (their keys are not local).
        """
        if self.global_tokens or self.random_blocks:
            return False
        shortest = STRIDED_MIN_LENGTH if self.stride else BLOCKWISE_MIN_LENGTH
        return 0 < 2 * self.size < length and length >= shortest

    def extra_keys(
        self, length: int, layer: int, max_len: int, device: torch.device
    ) -> Tensor | None:
        """(length, length) True where query i also sees key j beyond the window: a global
        position on either side, or a key in one of the random blocks of i's block at `layer`.
        None when the window adds none.

        The random blocks are drawn over the blocks of `max_len` positions, once per layer,
        so a row's keys never depend on how far its batch is padded; a block drawn past
        `length` is simply not there.
        """
        if not (self.global_tokens or self.random_blocks):
            return None
        return _extra_keys(self, length, layer, max_len).to(device, copy=True)  # the cache stays

    def cache_slots(self, capacity: int) -> int:
        """Keys a decoding cache of `capacity` positions holds at once.

        A plain window never looks further back than `size` - 1 positions, so
        the cache can be a ring of `size` slots; strided keys reach back past
        any window, so those keep every position.
        """
        return self.size if 0 < self.size < capacity and not self.stride else capacity


NO_WINDOW = Window()  # every key


@functools.lru_cache(maxsize=256)
def _extra_keys(window: Window, length: int, layer: int, max_len: int) -> Tensor:
    """`Window.extra_keys` on the CPU, drawn once per (window, length, layer, max_len): each
    training step of an encoder would otherwise redraw the same mask for every layer."""
    extra = torch.zeros(length, length, dtype=torch.bool)
    extra[: window.global_tokens] = True
    extra[:, : window.global_tokens] = True
    if window.random_blocks:
        blocks = -(-max_len // window.size)
        generator = torch.Generator().manual_seed(RANDOM_SEED + layer)
        drawn = torch.rand(blocks, blocks, generator=generator).argsort(1)
        block_keys = torch.zeros(blocks, blocks, dtype=torch.bool)
        block_keys.scatter_(1, drawn[:, : window.random_blocks], True)
        position_block = torch.arange(length) // window.size
        extra |= block_keys[position_block][:, position_block]
    return extra
