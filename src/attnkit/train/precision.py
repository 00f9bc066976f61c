"""The precision a training runs in: `train.precision`'s `auto` resolved for this device.

bf16 where the device multiplies it fast (CUDA, or a CPU with AVX512-BF16 or
AMX), fp32 elsewhere; fp16 only on CUDA, with a loss scaler.
"""

from __future__ import annotations

import logging

import torch

from attnkit.errors import AttnkitError
from attnkit.nn.compute_type import refusal

log = logging.getLogger(__name__)


def training_precision(precision: str, device: torch.device) -> str:
    """`train.precision` as the trainer runs it: `auto` becomes bf16 where it is fast, else fp32.

    An explicit bf16 on a CPU without bfloat16 products runs (it is correct, only
    slow), with a warning; fp16 needs CUDA.
    """
    if precision == "fp16" and device.type != "cuda":
        raise AttnkitError("train.precision 'fp16' needs CUDA; use 'bf16' on the CPU")
    fast_bf16 = refusal("bf16", device) is None
    if precision == "auto":
        return "bf16" if fast_bf16 else "fp32"
    if precision == "bf16" and not fast_bf16:
        log.warning("train.precision bf16: %s", refusal("bf16", device).replace("; use", "; try"))
    return precision
