"""A run's batches: token-budget loaders of its datasets, this rank's shard of each.

Examples of similar length are grouped under `data.max_tokens` ids a side
(`attnkit.data.TokenBudgetSampler`), or `data.batch_size` examples of one
length for a language model's blocks. Training batches are shuffled by
(seed, epoch); validation comes shortest first. Under torchrun each rank
takes every world_size-th batch, unless the loader is unsharded (a metric
that rank 0 computes over every example). With `segment_recurrence.carry = "stream"`, a
language model's blocks come as contiguous streams instead, one a row
(`attnkit.train.segment_recurrence.StreamBlocks`).
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset

from attnkit.data import TokenBudgetSampler
from attnkit.devices import resolve_device
from attnkit.train import distributed as dist
from attnkit.train.run_config import RunConfig
from attnkit.train.segment_recurrence import StreamBlocks


def run_loaders(
    config: RunConfig, train: Dataset, val: Dataset, max_batch_size: int | None = None
) -> tuple[DataLoader, DataLoader]:
    """The loaders of this rank's shard of the training and of the validation set."""
    return (
        run_loader(config, train, True, max_batch_size),
        run_loader(config, val, False, max_batch_size),
    )


def run_loader(
    config: RunConfig,
    dataset: Dataset,
    shuffle: bool,
    max_batch_size: int | None = None,
    shard: bool = True,
) -> DataLoader:
    """A loader of `dataset` (which has `lengths` and `collate`), of this rank's shard of it
    if `shard`."""
    d = config.data
    info = dist.from_env() if shard else dist.DistInfo()
    carried = config.segment_recurrence.carry == "stream" and d.task == "language-model"
    if carried and max_batch_size is not None:
        # Transformer-XL's memory across batches: each row reads on along its own stream.
        streams = StreamBlocks(dataset, max_batch_size, info.rank, info.world_size)
        return DataLoader(
            streams,
            batch_sampler=streams.batches(),
            collate_fn=streams.collate,
            num_workers=d.num_workers,
            pin_memory=resolve_device(config.train.device).type == "cuda",
        )
    max_tokens = d.max_tokens
    if max_batch_size is not None:
        max_tokens = max_batch_size * int(dataset.lengths.max())
    sampler = TokenBudgetSampler(
        dataset.lengths,
        max_tokens,
        max_batch_size=max_batch_size,
        shuffle=shuffle,
        seed=config.train.seed,
        rank=info.rank,
        world_size=info.world_size,
    )
    # Its own generator keeps the loader off the global RNG, which a resume restores exactly.
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=dataset.collate,
        num_workers=d.num_workers,
        generator=torch.Generator().manual_seed(config.train.seed),
        # Page-locked batches let the copy to a GPU overlap the step before.
        pin_memory=resolve_device(config.train.device).type == "cuda",
    )
