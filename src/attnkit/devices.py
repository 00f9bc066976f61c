"""The device a run uses: a name checked against this machine, in one sentence when it cannot be."""

from __future__ import annotations

import torch

from attnkit.errors import AttnkitError


def parse_device(device: str | torch.device, setting: str = "device") -> torch.device:
    """`device` as a torch.device, any type torch knows (cpu, cuda, mps, xpu, ...), unchecked
    against this machine; a name torch does not know is refused in one sentence naming `setting`."""
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise AttnkitError(
            f"{setting} {str(device)!r} is not a device torch knows; use cpu, cuda, cuda:N, "
            "mps, xpu or another torch device type"
        ) from None


def check_device(device: str | torch.device, setting: str = "device") -> torch.device:
    """`device` as a torch.device, refused in one sentence when torch does not know it or
    this machine does not have it (`cuda` where there is no GPU, `cuda:3` of two, `mps` off a
    Mac). `setting` names where the value came from (`--device`, `train.device`)."""
    found = parse_device(device, setting)
    if found.type == "cpu":
        return found
    backend, kind = getattr(torch, found.type, None), found.type.upper()
    if not getattr(backend, "is_available", lambda: False)():
        raise AttnkitError(
            f"{setting} {str(device)!r} is not available: torch finds no {kind} device on this "
            "machine; use cpu"
        )
    count = getattr(backend, "device_count", lambda: None)()
    if found.index is not None and count is not None and found.index >= count:
        raise AttnkitError(
            f"{setting} {str(device)!r} is not available: this machine has {count} {kind} "
            "device(s), numbered from 0; use one of them"
        )
    return found


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """`train.device` as the device of this process: `auto` is a CUDA GPU where there is one,
    else the CPU; any other name is a torch device this machine must have. A bare `cuda` is
    the `local_rank`-th GPU, so that each process of a multi-GPU run takes its own."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    found = check_device(name, "train.device")
    if found.type == "cuda" and found.index is None:
        return torch.device("cuda", local_rank)
    return found
