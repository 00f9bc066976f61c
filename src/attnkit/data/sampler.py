"""Token-budget batching: examples of similar length grouped under a budget of tokens.

As fairseq's `--max-tokens`: examples are sorted by length and cut greedily
into batches whose padded tensors hold at most `max_tokens` ids per side
(batch size x longest example <= max_tokens), so short sentences make big
batches, long ones small batches, and little of either is padding. The
batches, not the examples, are then shuffled, with a generator seeded by
(seed, epoch): every rank computes the same plan and takes every
world_size-th batch, so the ranks of a `torchrun` job see disjoint parts that
together cover each example exactly once per epoch, in equal numbers of steps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler

from attnkit.errors import AttnkitError


class TokenBudgetSampler(Sampler[list[int]]):
    """Batches of example indices for `DataLoader(batch_sampler=...)`.

    lengths: ids per example, shape (examples,) or (examples, sides) for pairs
        (a dataset's `lengths`); the budget holds for every side.
    max_tokens: the most ids in one side's padded batch tensor.
    max_batch_size: an optional cap on examples per batch.
    shuffle: shuffle batches (and equal-length examples) each epoch; off, the
        batches come shortest first, as evaluation wants.
    seed: the same on every rank; with `set_epoch` it fixes the whole order.
    rank, world_size: this process's share of the batches.
    """

    def __init__(
        self,
        lengths: Sequence[int] | Sequence[Sequence[int]] | np.ndarray,
        max_tokens: int,
        *,
        max_batch_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        lengths = np.asarray(lengths, dtype=np.int64)
        self.lengths = lengths[:, None] if lengths.ndim == 1 else lengths
        if self.lengths.ndim != 2 or len(self.lengths) == 0:
            raise AttnkitError(
                "lengths must be a non-empty list of example lengths (or of (source, target) pairs)"
            )
        if not 0 <= rank < world_size:
            raise AttnkitError(
                f"rank {rank} is not in 0..{world_size - 1} (world_size {world_size})"
            )
        if len(self.lengths) < world_size:
            raise AttnkitError(
                f"{len(self.lengths)} examples cannot be shared among {world_size} ranks; "
                "use more data or fewer ranks"
            )
        longest = int(self.lengths.max())
        if longest > max_tokens:
            raise AttnkitError(
                f"an example has {longest} tokens, over max_tokens {max_tokens}; raise max_tokens "
                "or drop long examples with the dataset's max_len"
            )
        if max_batch_size is not None and max_batch_size < 1:
            raise AttnkitError(f"max_batch_size must be a positive integer, got {max_batch_size}")
        self.max_tokens = max_tokens
        self.max_batch_size = max_batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self._plan: tuple[int, list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order `__iter__` gives (call it before each epoch)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())

    def padding_efficiency(self) -> float:
        """Real tokens / all tokens in this rank's padded batches for the current epoch."""
        real = total = 0
        for batch in self._batches():
            rows = self.lengths[batch]
            real += int(rows.sum())
            total += len(batch) * int(rows.max(axis=0).sum())
        return real / total

    def _batches(self) -> list[list[int]]:
        if self._plan is None or self._plan[0] != self.epoch:
            self._plan = (self.epoch, self._plan_epoch(self.epoch)[self.rank :: self.world_size])
        return self._plan[1]

    def _plan_epoch(self, epoch: int) -> list[list[int]]:
        """Every rank's batches for one epoch, in the order they are served."""
        rng = np.random.default_rng([self.seed, epoch])
        n = len(self.lengths)
        # Ties between equal lengths are broken at random, so batches change
        # from epoch to epoch while their shapes (and count) stay the same.
        tiebreak = rng.random(n) if self.shuffle else np.arange(n)
        columns = [self.lengths[:, side] for side in reversed(range(self.lengths.shape[1]))]
        order = np.lexsort((tiebreak, *columns, self.lengths.max(axis=1)))
        batches = self._cut(order)
        _split_until_divisible(batches, self.world_size)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _cut(self, order: np.ndarray) -> list[list[int]]:
        """Greedy cut of length-sorted indices into batches within the budget."""
        cap = self.max_batch_size or len(order)
        longest_of = self.lengths.max(axis=1)[order].tolist()
        indices = order.tolist()
        batches: list[list[int]] = []
        current: list[int] = []
        longest = 0
        for index, length in zip(indices, longest_of, strict=True):
            widest = max(longest, length)
            if current and ((len(current) + 1) * widest > self.max_tokens or len(current) == cap):
                batches.append(current)
                current, widest = [], length
            current.append(index)
            longest = widest
        batches.append(current)
        return batches


def _split_until_divisible(batches: list[list[int]], world_size: int) -> None:
    # Every rank must take the same number of steps (DDP waits on all of them),
    # yet no example may be dropped or repeated: halve the largest batches,
    # which keeps them within the budget, until the count divides evenly.
    while len(batches) % world_size:
        largest = max(range(len(batches)), key=lambda i: len(batches[i]))
        if len(batches[largest]) < 2:
            raise AttnkitError(
                f"{len(batches)} single-example batches cannot be shared evenly among "
                f"{world_size} ranks; raise max_tokens or use fewer ranks"
            )
        batch = batches.pop(largest)
        half = len(batch) // 2
        batches[largest:largest] = [batch[:half], batch[half:]]
