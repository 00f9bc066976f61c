"""The few-row product kernel of `few_rows.c`: built once per machine, called through ctypes.

A decoding step multiplies one row per sentence by every weight matrix, and
for up to `Linear`'s `KERNEL_ROWS` rows this kernel reads each weight once, in
stored order, faster than the BLAS (see `few_rows.c`). It is built on
first use by `attnkit.kernels.loader` (a C compiler, a fraction of a second, cached).

It is built only for x86-64 CPUs with AVX2 and FMA, where it was measured.
Elsewhere, with `ATTNKIT_FEW_ROWS_KERNEL=0`, or when the build fails (one
warning says why), `available()` is False and `Linear` keeps its other paths.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import torch
from torch import Tensor

from attnkit.kernels import loader

SOURCE = Path(__file__).with_name("few_rows.c")
FLAGS = (*loader.BASE_FLAGS, *loader.AVX2_FLAGS)


@functools.cache
def _kernel():
    """The C function, or None where it is not built (see the module's docstring)."""
    if os.environ.get("ATTNKIT_FEW_ROWS_KERNEL", "1") == "0":
        return None
    if not loader.avx2_cpu():
        return None
    library = loader.load(SOURCE, FLAGS, "decoding runs slower")
    if library is None:
        return None
    function = library.few_rows_linear
    function.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    function.restype = None
    return function


def available() -> bool:
    """Whether `linear` can run on this machine (the first call builds or loads the kernel)."""
    return _kernel() is not None


def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x W^T + b for float32 CPU tensors, W and b contiguous, x of any shape (..., in).

    Only where `available()`; `Linear` checks that and the rest before it calls this.
    """
    rows = x.reshape(-1, weight.shape[1]).contiguous()
    y = torch.empty(rows.shape[0], weight.shape[0], dtype=x.dtype)
    _kernel()(
        rows.data_ptr(),
        weight.data_ptr(),
        None if bias is None else bias.data_ptr(),
        y.data_ptr(),
        rows.shape[0],
        weight.shape[1],
        weight.shape[0],
        torch.get_num_threads(),
    )
    return y.view(*x.shape[:-1], weight.shape[0])
