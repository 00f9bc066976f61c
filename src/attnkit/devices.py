"""The device a run uses: a name checked against this machine, in one sentence when it cannot be."""

from __future__ import annotations

import torch

from attnkit.errors import AttnkitError


def check_device(device: str | torch.device) -> torch.device:
    """`device` as a torch.device, refused in one sentence when torch does not know it or
    this machine does not have it (`cuda` where there is no GPU, `cuda:3` of two)."""
    try:
        found = torch.device(device)
    except (RuntimeError, TypeError):
        raise AttnkitError(
            f"device {str(device)!r} is not a device torch knows; use cpu, cuda, cuda:N or mps"
        ) from None
    if found.type == "cpu":
        return found
    backend, kind = getattr(torch, found.type, None), found.type.upper()
    if not getattr(backend, "is_available", lambda: True)():
        raise AttnkitError(
            f"device {str(device)!r} is not available: torch finds no {kind} device on this "
            "machine; use cpu"
        )
    count = getattr(backend, "device_count", lambda: None)()
    if found.index is not None and count is not None and found.index >= count:
        raise AttnkitError(
            f"device {str(device)!r} is not available: this machine has {count} {kind} "
            "device(s), numbered from 0; use one of them"
        )
    return found


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """`train.device` (cpu, cuda or auto) as the device of this process, which is the
    `local_rank`-th GPU of a multi-GPU run."""
    if name == "cuda" and not torch.cuda.is_available():
        raise AttnkitError("train.device is 'cuda' but no CUDA device is available; use 'cpu'")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(f"cuda:{local_rank}" if name == "cuda" else "cpu")
