"""The int8 few-row kernel of `int8_rows.c`: y = x W^T + b with W in int8, built per CPU.

`Int8Linear` calls it for up to `KERNEL_ROWS` rows (a decoding step's one row per
sentence): each row of x is quantized on its own peak and W is read once, in
int8, with no packing and no copy. Two builds of the one source: `vnni` (AVX512-VNNI
byte products) where the CPU has AVX512-VNNI and AVX512-BW, `avx2` (16-bit pair
products) on any x86-64 CPU with AVX2; `best()` picks, and the tests run each
build the CPU can run. With `ATTNKIT_INT8_KERNEL=0`, off x86 or when the build
fails (one warning says why), `best()` is None and `Int8Linear` uses its
many-row path for every call.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import torch
from torch import Tensor

from attnkit import kernels
from attnkit.cpu import this_cpu

SOURCE = Path(__file__).with_name("int8_rows.c")
KERNEL_ROWS = 16  # the C file's MAX_ROWS
# No fused multiply-adds: the result must round as the many-row path's float32 steps do.
_BASE = tuple(
    "-ffp-contract=off" if f.startswith("-ffp-contract") else f for f in kernels.BASE_FLAGS
)
BUILDS = {
    "vnni": (*_BASE, *kernels.AVX2_FLAGS, "-mavx512f", "-mavx512bw", "-mavx512vnni"),
    "avx2": (*_BASE, *kernels.AVX2_FLAGS),
}


def runnable() -> list[str]:
    """The builds this CPU can run, fastest first."""
    cpu = this_cpu()
    if not kernels.avx2_cpu():
        return []
    vnni = cpu.has("avx512_vnni") and cpu.has("avx512bw")
    return ["vnni", "avx2"] if vnni else ["avx2"]


@functools.cache
def _kernel(build: str):
    """The C function of `build`, or None where it is not built."""
    library = kernels.load(SOURCE, BUILDS[build], "int8 decoding runs slower")
    if library is None:
        return None
    function = library.int8_rows_linear
    function.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 3 + [ctypes.c_int] * 2
    function.restype = ctypes.c_int
    return function


def best() -> str | None:
    """The build `Int8Linear` uses here, or None (see the module's docstring)."""
    if os.environ.get("ATTNKIT_INT8_KERNEL", "1") == "0":
        return None
    return next((b for b in runnable() if _kernel(b) is not None), None)


def linear(
    rows: Tensor,
    weight: Tensor,
    offset: Tensor,
    scale: Tensor,
    bias: Tensor | None,
    levels: int,
    build: str,
) -> Tensor:
    """(rows, out) float32 for contiguous float32 `rows` (at most KERNEL_ROWS), int8 `weight`
    (out, in), int32 `offset` (128 sum_k W_ok, read by the vnni build), float32 `scale`;
    each row quantized to whole numbers in [-levels, levels]."""
    y = torch.empty(rows.shape[0], weight.shape[0])
    refused = _kernel(build)(
        rows.data_ptr(),
        weight.data_ptr(),
        offset.data_ptr(),
        scale.data_ptr(),
        None if bias is None else bias.data_ptr(),
        y.data_ptr(),
        rows.shape[0],
        weight.shape[1],
        weight.shape[0],
        levels,
        torch.get_num_threads(),
    )
    if refused:
        raise ValueError(f"the int8 kernel takes at most {KERNEL_ROWS} rows, not {rows.shape[0]}")
    return y
