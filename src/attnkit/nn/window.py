"""The attention window: which keys a query reaches, and what that implies for running it.

A window of w keys lets query i see the keys j with |i - j| < w (i - j < w
when causal: Mistral, Longformer); a stride s adds those with i - j a multiple
of s (the Sparse Transformer's strided pattern, Child et al. 2019).

`Window` is the one place that decides what a window implies: whether a
sequence runs block by block (`local_attention`) or under the window as a
mask, and how many keys a decoding cache must hold (a ring of w slots).
"""

from __future__ import annotations

from dataclasses import dataclass

# Below these many positions the mask (full attention) is as fast as the blocks or faster
# (bench/bench_window.py: a window of 32 alone 0.69x at 128 positions, 1.02x at 256, 2.03x at
# 512; a window and a stride of 32, 0.45x at 256, 1.21x at 512, 1.73x at 1,024).
BLOCKWISE_MIN_LENGTH = 256
STRIDED_MIN_LENGTH = 512


@dataclass(frozen=True, slots=True)
class Window:
    """The reach of local attention: `size` keys (0: every key), plus every `stride`-th key."""

    size: int = 0
    stride: int = 0

    def runs_blockwise(self, length: int) -> bool:
        """Whether the window over `length` positions pays for `local_attention`."""
        shortest = STRIDED_MIN_LENGTH if self.stride else BLOCKWISE_MIN_LENGTH
        return 0 < 2 * self.size < length and length >= shortest

    def cache_slots(self, capacity: int) -> int:
        """Keys a decoding cache of `capacity` positions holds at once.

        A plain window never looks further back than `size` - 1 positions, so
        the cache can be a ring of `size` slots; strided keys reach back past
        any window, so those keep every position.
        """
        return self.size if 0 < self.size < capacity and not self.stride else capacity


NO_WINDOW = Window()  # every key
