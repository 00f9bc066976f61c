"""C kernels built on the machine that runs them, and loaded through ctypes.

Where a loop has no fast form in tensor operations (a few rows of a matrix
product read once; word2vec's one-pair-at-a-time SGD), attnkit ships it as a
small C file and builds it the first time it is needed. Building takes a C
compiler (`$CC`, else `cc`) and a fraction of a second; the shared library
goes to `$XDG_CACHE_HOME/attnkit` (`~/.cache/attnkit`) under a name hashed from
the source, the compiler and the flags, so an edited source is rebuilt and
processes that start together each write their own file before renaming it.

Without a C compiler nothing is built: the decoding kernels give way to their
pure-PyTorch equivalents (the same results, slower), and one warning, the first
time a kernel is asked for, says so and what is slower; word2vec and GloVe, whose
loops have no such equivalent, stop in one sentence when they start.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

# -ffp-contract=fast turns each multiply-add into one FMA instruction.
BASE_FLAGS = ("-O3", "-ffp-contract=fast", "-fopenmp", "-shared", "-fPIC")
AVX2_FLAGS = ("-mavx2", "-mfma")

# What runs slower, or not at all, without a C compiler: the warning's words.
WITHOUT_A_COMPILER = (
    "decoding (the linear layers of a few rows, int8 rows and each step's attention) runs in "
    "plain PyTorch operations, slower on a CPU, and word2vec and GloVe cannot train"
)


class NoCompiler(OSError):
    """No C compiler: `$CC`, else `cc`, is not a program on this machine."""


_warned_no_compiler = False


def cache_dir() -> Path:
    """Where built kernels are kept: `$XDG_CACHE_HOME/attnkit`, else `~/.cache/attnkit`."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnkit"


def avx2_cpu() -> bool:
    """An x86-64 CPU with AVX2 and FMA (torch's capability AVX2 or AVX512)."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return x86 and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def build(source: Path, flags: Sequence[str], compiler: str, directory: Path) -> Path:
    """Compile `source` into `directory` unless it is there already; return the library."""
    text = source.read_bytes()
    key = hashlib.sha256(text + compiler.encode() + " ".join(flags).encode()).hexdigest()
    library = directory / f"{source.stem}-{key[:16]}.so"
    if library.exists():
        return library
    if shutil.which(compiler) is None:
        raise NoCompiler(f"{compiler} is not a program here: install gcc, or name one in $CC")
    directory.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(suffix=".so", dir=directory)
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, *flags, str(source), "-o", partial], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise OSError(f"{compiler} failed: {done.stderr.strip()[-500:]}")
        os.replace(partial, library)
    finally:
        Path(partial).unlink(missing_ok=True)
    return library


def load(source: Path, flags: Sequence[str], without: str) -> ctypes.CDLL | None:
    """The built library of `source`, or None with a warning saying what goes `without` it:
    one a process for all kernels when there is no compiler (`WITHOUT_A_COMPILER`)."""
    global _warned_no_compiler
    compiler = os.environ.get("CC", "cc")
    try:
        return ctypes.CDLL(str(build(source, flags, compiler, cache_dir())))
    except NoCompiler as error:
        if not _warned_no_compiler:
            _warned_no_compiler = True
            logger.warning("no C compiler (%s), so attnkit's C kernels are not built: %s",
                           error, WITHOUT_A_COMPILER)  # fmt: skip
        logger.debug("%s was not built, %s", source.name, without)
        return None
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:  # RuntimeError: no home
        logger.warning("%s was not built, %s: %s", source.name, without, error)
        return None
