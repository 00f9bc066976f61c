"""The int8 few-row kernel of `int8_rows.c`: y = x W^T + b with W in int8, built per CPU.

`Int8Linear` calls it for up to `KERNEL_ROWS` rows (a decoding step's one row per
sentence): each row of x is quantized on its own peak and W is read once, in
int8, with no packing and no copy. With more rows, its first and last steps
(`quantize_rows`, `rescale`) run around a library's int8 product. Two builds of
the one source: `vnni` (AVX512-VNNI byte products) where the CPU has AVX512-VNNI
and AVX512-BW, `avx2` (16-bit pair products) on any x86-64 CPU with AVX2;
`best()` picks, and the tests run each build the CPU can run. With
`ATTNKIT_INT8_KERNEL=0`, off x86 or when the build fails (one warning says why),
`best()` is None and `Int8Linear` computes the same steps in torch operations
around its many-row product, for every call.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import torch
from torch import Tensor

from attnkit.kernels import loader
from attnkit.kernels.cpu import this_cpu

SOURCE = Path(__file__).with_name("int8_rows.c")
KERNEL_ROWS = 16  # the C file's MAX_ROWS
# No fused multiply-adds: the result must round as the many-row path's float32 steps do.
_BASE = tuple(
    "-ffp-contract=off" if f.startswith("-ffp-contract") else f for f in loader.BASE_FLAGS
)
BUILDS = {
    "vnni": (*_BASE, *loader.AVX2_FLAGS, "-mavx512f", "-mavx512bw", "-mavx512vnni"),
    "avx2": (*_BASE, *loader.AVX2_FLAGS),
}


def runnable() -> list[str]:
    """The builds this CPU can run, fastest first."""
    cpu = this_cpu()
    if not loader.avx2_cpu():
        return []
    vnni = cpu.has("avx512_vnni") and cpu.has("avx512bw")
    return ["vnni", "avx2"] if vnni else ["avx2"]


_POINTER, _SIZE, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {
    "int8_rows_linear": ([_POINTER] * 6 + [_SIZE] * 3 + [_INT] * 2, ctypes.c_int),
    "int8_quantize_rows": ([_POINTER] * 3 + [_SIZE] * 2 + [_INT] * 2, None),
    "int8_rescale": ([_POINTER] * 4 + [_SIZE] * 2 + [_INT], None),
}


@functools.cache
def _library(build: str) -> ctypes.CDLL | None:
    """The built library of `build` with its functions typed, or None where it is not built."""
    library = loader.load(SOURCE, BUILDS[build], "int8 decoding runs slower")
    if library is None:
        return None
    for name, (argtypes, restype) in _SIGNATURES.items():
        function = getattr(library, name)
        function.argtypes, function.restype = argtypes, restype
    return library


def best() -> str | None:
    """The build `Int8Linear` uses here, or None (see the module's docstring)."""
    if os.environ.get("ATTNKIT_INT8_KERNEL", "1") == "0":
        return None
    return next((b for b in runnable() if _library(b) is not None), None)


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
    y = torch.empty(rows.shape[0], weight.shape[0], dtype=torch.float32)
    refused = _library(build).int8_rows_linear(
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


def quantize_rows(rows: Tensor, levels: int, build: str) -> tuple[Tensor, Tensor]:
    """(q, s): contiguous float32 `rows` quantized each on its own peak, q int8 (rows, in) in
    [-levels, levels] and s float32 (rows, 1), as the kernel does before its products."""
    q = torch.empty(rows.shape, dtype=torch.int8)
    s = torch.empty(rows.shape[0], 1, dtype=torch.float32)
    _library(build).int8_quantize_rows(
        rows.data_ptr(),
        q.data_ptr(),
        s.data_ptr(),
        rows.shape[0],
        rows.shape[1],
        levels,
        torch.get_num_threads(),
    )
    return q, s


def rescale(
    dots: Tensor, scale: Tensor, row_scale: Tensor, bias: Tensor | None, build: str
) -> Tensor:
    """((dots * scale) * row_scale) + bias in float32, as the kernel ends, for the contiguous
    int32 sums `dots` (rows, out) of an int8 product, `scale` (out,) and `row_scale` (rows, 1).

    Written over `dots` (4 bytes each as well): no new buffer for a large output."""
    _library(build).int8_rescale(
        dots.data_ptr(),
        scale.data_ptr(),
        row_scale.data_ptr(),
        None if bias is None else bias.data_ptr(),
        dots.shape[0],
        dots.shape[1],
        torch.get_num_threads(),
    )
    return dots.view(torch.float32)
