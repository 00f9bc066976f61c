"""Data-parallel training under `torchrun`: one process per device, gradients averaged.

    torchrun --nproc_per_node=N -m attnkit train CONFIG.toml

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; each process trains on its
own shard of the data and DistributedDataParallel all-reduces (averages) the
gradients, so every rank takes the same optimizer step (or FSDP2 shards the model:
`attnkit.train.parallel`). Only rank 0 logs and writes the run folder's files (under
FSDP every rank also writes its shard of each checkpoint). Without torchrun
everything here is a no-op for one process, except the group of one that FSDP
shards over when asked to run alone.

Across machines (`torchrun --nnodes=M`), the run folder must be one folder that every
rank sees at the same path (a network or cluster filesystem): rank 0 writes it, and
every rank reads it (the tokenizer rank 0 made, a checkpoint to resume) and, under FSDP,
writes its own shard of each checkpoint there. `check_shared_folder` refuses a run
whose ranks do not all see it, before any work.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from attnkit.errors import AttnkitError

log = logging.getLogger(__name__)

# How long ranks wait for each other to join by default (`train.rendezvous_timeout`).
DEFAULT_RENDEZVOUS_TIMEOUT = 300.0


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

    Data loaders use it to pick their shard before the trainer starts. What torchrun would
    never set (a WORLD_SIZE that is no number, a missing RANK, a RANK past the WORLD_SIZE)
    is refused in one sentence, at once: such ranks would otherwise wait for each other.
    """
    world_size = _env_int("WORLD_SIZE", "1", "the number of processes training together")
    if world_size < 1:
        raise AttnkitError(f"WORLD_SIZE is {world_size}, not a number of processes (1 or more)")
    if world_size == 1:
        return DistInfo()
    if "RANK" not in os.environ:
        raise AttnkitError(
            f"WORLD_SIZE is {world_size} but RANK is not set, so this process cannot tell which "
            "of the ranks it is; start the ranks with torchrun, which sets both"
        )
    rank = _env_int("RANK", "0", "this process's place among the ranks")
    if not 0 <= rank < world_size:
        raise AttnkitError(
            f"RANK is {rank}, but WORLD_SIZE {world_size} counts ranks 0 to {world_size - 1}; "
            "start the ranks with torchrun, which numbers them"
        )
    local_rank = _env_int("LOCAL_RANK", "0", "this process's place on its machine")
    return DistInfo(rank, world_size, local_rank)


def _env_int(name: str, default: str, what: str) -> int:
    value = os.environ.get(name, default)
    try:
        return int(value)
    except ValueError:
        raise AttnkitError(
            f"{name} is {value!r}, which should be a whole number ({what}); torchrun sets it, "
            "or unset WORLD_SIZE, RANK and LOCAL_RANK to train in one process"
        ) from None


def setup(
    device_type: str, *, alone: bool = False, timeout: float = DEFAULT_RENDEZVOUS_TIMEOUT
) -> DistInfo:
    """Join the process group torchrun describes (gloo on CPU, NCCL on CUDA), if any; with
    `alone`, a process without torchrun makes a group of one (FSDP shards over a group).

    Every rank waits at most `timeout` seconds (`train.rendezvous_timeout`) for the others
    to join, then stops in one sentence (`rendezvous`), rather than torch's silent 30 minutes.
    """
    info = from_env()
    if (info.active or alone) and not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(info.local_rank)
        if info.active:
            store = rendezvous(info, timeout)
            dist.init_process_group(
                backend, store=store, rank=info.rank, world_size=info.world_size
            )
        else:  # no torchrun, no rendezvous: the group's store lives in this process
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        log.debug("rank %d of %d joined the %s process group", info.rank, info.world_size, backend)
    return info


def rendezvous(info: DistInfo, timeout: float) -> dist.Store:
    """The store torchrun's variables (MASTER_ADDR, MASTER_PORT) point at, once all
    `info.world_size` ranks have joined it; past `timeout` seconds, one sentence that says how
    many came. torch's own wait (30 minutes, in silence) is what a wrong WORLD_SIZE or a rank
    that never started would otherwise get."""
    limit = timedelta(seconds=timeout)
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    missing = (
        f"rank {info.rank} of WORLD_SIZE {info.world_size} waited {timeout:g} s "
        "(train.rendezvous_timeout)"
    )
    try:
        store, _, _ = next(dist.rendezvous("env://", info.rank, info.world_size, timeout=limit))
    except ValueError as err:  # MASTER_ADDR or MASTER_PORT unset or wrong
        raise AttnkitError(f"the ranks cannot meet ({err}); start them with torchrun") from None
    except (RuntimeError, OSError) as err:  # DistStoreError: the others never came
        whom = (
            "for the other ranks to join its store"
            if info.rank == 0
            else f"for rank 0's store at {where}, which never answered"
        )
        raise AttnkitError(
            f"{missing} {whom} ({err}); start as many ranks as WORLD_SIZE counts, with one "
            "torchrun and its nproc_per_node, or raise train.rendezvous_timeout"
        ) from None
    # Each start of torchrun's workers (a restart too) counts its own arrivals.
    key = f"attnkit/joined/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    deadline = time.monotonic() + timeout
    try:
        came = store.add(key, 1)
        while came < info.world_size and time.monotonic() < deadline:
            time.sleep(0.05)
            came = store.add(key, 0)
    except (RuntimeError, OSError) as err:  # rank 0, and its store, stopped meanwhile
        raise AttnkitError(
            f"rank {info.rank} lost rank 0's store at {where} while the ranks joined ({err}); "
            "see rank 0's message"
        ) from None
    if came < info.world_size:
        raise AttnkitError(
            f"{missing} and only {came} of the {info.world_size} ranks joined; start as many "
            "ranks as WORLD_SIZE counts (one torchrun and its nproc_per_node), or raise "
            "train.rendezvous_timeout"
        )
    return store


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def is_active() -> bool:
    """Whether this process trains beside others (a process group of more than one rank)."""
    return dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    """How many ranks train together (1 for one process)."""
    return dist.get_world_size() if dist.is_initialized() else 1


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


def refuse_together(check: Callable[[], None]) -> None:
    """Run `check` on rank 0; when it refuses (`AttnkitError`), every rank stops with its
    sentence, rather than the others waiting for rank 0 until a timeout."""
    refusal = None
    if from_env().is_main:
        try:
            check()
        except AttnkitError as err:
            refusal = str(err)
    refusal = broadcast_object(refusal)
    if refusal:
        raise AttnkitError(refusal)


def check_shared_folder(root: Path) -> None:
    """Refuse, on every rank at once, a run folder that some rank cannot see.

    Rank 0 makes the folder and writes a file with a random name into it; each rank
    looks for that file at the same path. A rank on a machine where the path is another
    folder (a local disk) or none does not find it.
    """
    info = from_env()
    if not info.active:
        return
    name = broadcast_object(f".reachable-{secrets.token_hex(8)}.tmp")  # rank 0's
    if info.is_main:
        root.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(socket.gethostname())
    broadcast_object(None)  # written before any rank looks
    sights = gather_objects((info.rank, socket.gethostname(), (root / name).is_file()))
    if info.is_main:
        (root / name).unlink()
    blind = [f"rank {rank} on {host}" for rank, host, seen in sights if not seen]
    if blind:
        raise AttnkitError(
            f"{', '.join(blind)} cannot see the run folder {root} that rank 0 writes; put "
            "train.out_dir on a filesystem that every machine mounts at the same path (NFS, "
            "a cluster filesystem)"
        )
