"""The few-row product kernel of `few_rows.c`: built once per machine, called through ctypes.

A decoding step multiplies one row per sentence by every weight matrix, and
for up to `Linear`'s `KERNEL_ROWS` rows this kernel reads each weight once, in
stored order, faster than the BLAS (see `few_rows.c`). Building it takes a C
compiler (`$CC`, else `cc`) and a fraction of a second; the shared library
goes to `$XDG_CACHE_HOME/attnkit` (`~/.cache/attnkit`) under a name hashed from
the source, the compiler and the flags, so an edited source is rebuilt and
processes that start together each write their own file before renaming it.

It is built only for x86-64 CPUs with AVX2 and FMA, where it was measured.
Elsewhere, with `ATTNKIT_FEW_ROWS_KERNEL=0`, or when the build fails (one
warning says why), `available()` is False and `Linear` keeps its other paths.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("few_rows.c")
# -ffp-contract=fast turns each multiply-add into one FMA instruction.
FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=fast", "-fopenmp", "-shared", "-fPIC")


def cache_dir() -> Path:
    """Where built kernels are kept: `$XDG_CACHE_HOME/attnkit`, else `~/.cache/attnkit`."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnkit"


def build(compiler: str, directory: Path) -> Path:
    """Compile the kernel into `directory` unless it is there already; return the library."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + compiler.encode() + " ".join(FLAGS).encode()).hexdigest()
    library = directory / f"few_rows-{key[:16]}.so"
    if library.exists():
        return library
    directory.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(suffix=".so", dir=directory)
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, *FLAGS, str(SOURCE), "-o", partial], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise OSError(f"{compiler} failed: {done.stderr.strip()[-500:]}")
        os.replace(partial, library)
    finally:
        Path(partial).unlink(missing_ok=True)
    return library


def cpu_supported() -> bool:
    """An x86-64 CPU with AVX2 and FMA (torch's capability AVX2 or AVX512), as measured."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return x86 and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


@functools.cache
def _kernel():
    """The C function, or None where it is not built (see the module's docstring)."""
    if os.environ.get("ATTNKIT_FEW_ROWS_KERNEL", "1") == "0":
        return None
    if not cpu_supported():
        return None
    compiler = os.environ.get("CC", "cc")
    try:
        function = ctypes.CDLL(str(build(compiler, cache_dir()))).few_rows_linear
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:  # RuntimeError: no home
        logger.warning("the few-row kernel was not built, decoding runs slower: %s", error)
        return None
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
