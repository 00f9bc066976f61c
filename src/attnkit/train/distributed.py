"""Data-parallel training under `torchrun`: one process per device, gradients averaged.

    torchrun --nproc_per_node=N -m attnkit train CONFIG.toml

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; each process trains on its
own shard of the data and DistributedDataParallel all-reduces (averages) the
gradients, so every rank takes the same optimizer step. Only rank 0 logs and
writes files. Without torchrun everything here is a no-op for one process.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def from_env() -> DistInfo:
    """This process's place as torchrun describes it, before (or without) joining the group.

    Data loaders use it to pick their shard before the trainer starts.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return DistInfo()
    return DistInfo(int(os.environ["RANK"]), world_size, int(os.environ.get("LOCAL_RANK", "0")))


def setup(device_type: str) -> DistInfo:
    """Join the process group torchrun describes (gloo on CPU, NCCL on CUDA), if any."""
    info = from_env()
    if info.active and not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend)
        log.debug("rank %d of %d joined the %s process group", info.rank, info.world_size, backend)
    return info


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def is_active() -> bool:
    """Whether this process trains beside others (a process group of more than one rank)."""
    return dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over ranks, in place; identity for one process."""
    if is_active():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (a one-element list for one process)."""
    if not is_active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every rank."""
    if not is_active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
