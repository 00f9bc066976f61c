"""GloVe's C loops (`glove.c`), built on first use and called through ctypes.

`CountTable` counts co-occurrences chunk by chunk into an open-addressing hash
table that doubles when full, and gives them back as three arrays (rows,
columns, counts); `shuffle` mixes those in place; `train` runs one AdaGrad
pass over them. Building needs a C compiler (`$CC`, else `cc`;
`attnkit.kernels.loader`).
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import Tensor

from attnkit.errors import AttnkitError
from attnkit.kernels import loader

SOURCE = Path(__file__).with_name("glove.c")
# -march=native is left out: a cached build may be loaded by another CPU of a shared home;
# -fno-math-errno lets AdaGrad's square roots vectorise (twice the pairs a second on AVX2)
AVX2 = loader.AVX2_FLAGS if loader.avx2_cpu() else ()
FLAGS = (*loader.BASE_FLAGS, "-fno-math-errno", *AVX2)
EMPTY = 2**64 - 1  # the key of a free slot
MAX_LOAD = 0.7  # the share of slots the table fills before it doubles
GRADIENT_BOUND = 100.0  # each step's components are clipped to +-this (the reference tool's)

_P, _I64, _F32, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int


def build() -> None:
    """Build (or find) the C loops now, not at the first count."""
    _library()


@functools.cache
def _library() -> ctypes.CDLL:
    library = loader.load(SOURCE, FLAGS, "GloVe cannot train")
    if library is None:
        raise AttnkitError(
            "GloVe trains in C loops that could not be built: install a C compiler "
            "(gcc) or name one in $CC."
        )
    library.glove_count.argtypes = [_P, _P, _I64, _INT, _INT, _INT, _I64, _P, _P, _I64, _P, _I64]
    library.glove_count.restype = _I64
    library.glove_rehash.argtypes = [_P, _P, _I64, _P, _P, _I64, _P]
    library.glove_rehash.restype = None
    library.glove_extract.argtypes = [_P, _P, _I64, _I64, _P, _P, _P]
    library.glove_extract.restype = _I64
    library.glove_shuffle.argtypes = [_P, _P, _P, _I64, ctypes.c_uint64]
    library.glove_shuffle.restype = None
    library.glove_train.argtypes = [_P] * 8 + [_I64, _P, _P, _P, _I64] + [_F32] * 4 + [_INT]
    library.glove_train.restype = ctypes.c_double
    return library


class CountTable:
    """X[i, j] summed over chunks of sentences; memory grows with the distinct pairs only."""

    def __init__(
        self, vocab: int, window: int, symmetric: bool, distance_weighting: bool, slots: int = 1024
    ) -> None:
        if vocab >= 2**31:
            raise AttnkitError(f"GloVe counts up to 2^31 - 1 words, not {vocab}.")
        self.vocab, self.window = vocab, window
        self.symmetric, self.distance_weighting = int(symmetric), int(distance_weighting)
        self._allocate(1 << max(10, math.ceil(math.log2(slots))))
        self.used = 0

    def _allocate(self, capacity: int) -> None:
        self.keys = torch.full((capacity,), -1, dtype=torch.int64)  # all bits set: EMPTY
        self.values = torch.zeros(capacity, dtype=torch.float64)

    @property
    def capacity(self) -> int:
        return len(self.keys)

    @property
    def bytes(self) -> int:
        """The table's memory: 16 bytes a slot."""
        return 16 * self.capacity

    def add(self, ids: Tensor, starts: Tensor) -> None:
        """Count the sentences ids[starts[s]:starts[s + 1]] (word ids below `vocab`)."""
        ids, starts = ids.to(torch.long).contiguous(), starts.to(torch.long).contiguous()
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab):
            raise AttnkitError(f"the sentences hold ids outside the {self.vocab} words counted.")
        if len(starts) == 0 or starts[0] != 0 or starts[-1] != len(ids):
            raise AttnkitError("sentence starts must rise from 0 to the number of word ids.")
        done, n = 0, len(starts) - 1
        while done < n:
            longest = int((starts[done + 1] - starts[done]).item())
            while self.used + 2 * longest * self.window > MAX_LOAD * self.capacity:
                self._grow()
            used = ctypes.c_int64(self.used)
            part = starts[done:] - starts[done]
            counted = _library().glove_count(
                ids[int(starts[done]) :].data_ptr(), part.data_ptr(), n - done, self.window,
                self.symmetric, self.distance_weighting, self.vocab, self.keys.data_ptr(),
                self.values.data_ptr(), self.capacity, ctypes.byref(used),
                int(MAX_LOAD * self.capacity),
            )  # fmt: skip
            self.used = used.value
            done += counted

    def _grow(self) -> None:
        keys, values = self.keys, self.values
        self._allocate(2 * self.capacity)
        used = ctypes.c_int64(0)
        _library().glove_rehash(
            keys.data_ptr(), values.data_ptr(), len(keys), self.keys.data_ptr(),
            self.values.data_ptr(), self.capacity, ctypes.byref(used),
        )  # fmt: skip
        self.used = used.value

    def pairs(self) -> Cooccurrences:
        """The nonzero X_ij in the table's slot order."""
        out = Cooccurrences.empty(self.used)
        n = _library().glove_extract(
            self.keys.data_ptr(), self.values.data_ptr(), self.capacity, self.vocab,
            out.rows.data_ptr(), out.cols.data_ptr(), out.counts.data_ptr(),
        )  # fmt: skip
        assert n == self.used
        return out


@dataclass
class Cooccurrences:
    """The nonzero entries of X: X[rows[e], cols[e]] = counts[e] (int32, int32, float32)."""

    rows: Tensor
    cols: Tensor
    counts: Tensor

    @classmethod
    def empty(cls, n: int) -> Cooccurrences:
        int32 = torch.int32
        return cls(torch.empty(n, dtype=int32), torch.empty(n, dtype=int32), torch.empty(n))

    def __len__(self) -> int:
        return len(self.counts)

    @property
    def bytes(self) -> int:
        return 12 * len(self)

    def shuffle(self, seed: int) -> None:
        """Put the entries in a random order drawn from `seed`, in place."""
        _library().glove_shuffle(
            self.rows.data_ptr(), self.cols.data_ptr(), self.counts.data_ptr(), len(self),
            seed % 2**64,
        )  # fmt: skip


@dataclass
class Parameters:
    """What AdaGrad moves: word and context vectors and biases, and each one's accumulated
    squared steps (float32, contiguous, on the CPU)."""

    w: Tensor
    c: Tensor
    bw: Tensor
    bc: Tensor
    gw: Tensor
    gc: Tensor
    gbw: Tensor
    gbc: Tensor

    def __post_init__(self) -> None:
        for f in fields(self):
            t = getattr(self, f.name)
            if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
                raise AttnkitError("GloVe's parameters must be contiguous float32 CPU tensors.")


def train(
    params: Parameters,
    pairs: Cooccurrences,
    eta: float,
    x_max: float,
    alpha: float,
    threads: int,
) -> float:
    """One pass of AdaGrad over `pairs` in their order; returns sum 0.5 f(X)(diff)^2."""
    vocab = len(params.w)
    if len(pairs) and (
        int(pairs.rows.max()) >= vocab or int(pairs.cols.max()) >= vocab or pairs.counts.min() <= 0
    ):
        raise AttnkitError(f"co-occurrences must be positive counts of the {vocab} words.")
    if threads < 1:
        raise AttnkitError(f"GloVe needs 1 thread or more, not {threads}.")
    tensors = [getattr(params, f.name).data_ptr() for f in fields(params)]
    cost = _library().glove_train(
        *tensors, params.w.shape[1], pairs.rows.data_ptr(), pairs.cols.data_ptr(),
        pairs.counts.data_ptr(), len(pairs), eta, x_max, alpha, GRADIENT_BOUND, threads,
    )  # fmt: skip
    if math.isnan(cost):
        raise AttnkitError("GloVe's C loop found no memory for its buffers.")
    return cost
