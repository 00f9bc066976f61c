"""The C loop of word2vec's SGD (`sgns.c`), built on first use and called through ctypes.

`train` runs one pass of skip-gram or CBOW updates (negative sampling's, or with
`offsets` noise-contrastive estimation's) over a corpus held as one
row of word ids and its sentences' starts; `update` is the single update the
loop makes, for tests and for reading. Both change the input and output vectors
in place. Building needs a C compiler (`$CC`, else `cc`; `attnkit.kernels.loader`).
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnkit.errors import AttnkitError
from attnkit.kernels import loader

SOURCE = Path(__file__).with_name("sgns.c")
# -march=native is left out: a cached build may be loaded by another CPU of a shared home
FLAGS = (*loader.BASE_FLAGS, *(loader.AVX2_FLAGS if loader.avx2_cpu() else ()))

_P, _I64, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


def build() -> None:
    """Build (or find) the C loop now, not at the first update."""
    _library()


@functools.cache
def _library() -> ctypes.CDLL:
    library = loader.load(SOURCE, FLAGS, "word2vec cannot train")
    if library is None:
        raise AttnkitError(
            "word2vec trains in a C loop that could not be built: install a C compiler "
            "(gcc) or name one in $CC."
        )
    library.sgns_update.argtypes = [_P, _P, _I64, _P, _I64, _I64, _P, ctypes.c_int, _F32, _P, _P]
    library.sgns_update.restype = ctypes.c_double
    library.sgns_train.argtypes = [_P, _P, _I64, _I64, _P, _P, _I64, _P, _P, _P]
    library.sgns_train.argtypes += [ctypes.c_int] * 3 + [_P, _F32, _F32, ctypes.c_uint64]
    library.sgns_train.argtypes += [ctypes.c_int, _P]
    library.sgns_train.restype = ctypes.c_double
    library.sgns_draw.argtypes = [_P, _P, _I64, _I64, ctypes.c_uint64, _P]
    library.sgns_draw.restype = None
    return library


@dataclass
class Vectors:
    """The two matrices SGD moves: input vectors v (kept) and output vectors v' (float32)."""

    inputs: Tensor
    outputs: Tensor

    def __post_init__(self) -> None:
        for m in (self.inputs, self.outputs):
            if m.dtype != torch.float32 or not m.is_contiguous() or m.device.type != "cpu":
                raise AttnkitError("word2vec's vectors must be contiguous float32 CPU tensors.")


@dataclass(frozen=True)
class Sampling:
    """What the loop draws from: each word's chance to be kept, and the noise's alias table;
    with `offsets` (NCE's log k q(w), float32 per word) the loop estimates by NCE."""

    keep: Tensor  # float64, per word
    own: Tensor  # float64, per slot
    alias: Tensor  # int64, per slot
    window: int
    negative: int
    cbow: bool
    offsets: Tensor | None = None


def _offsets(offsets: Tensor | None, vocab: int) -> tuple[Tensor | None, int | None]:
    """NCE's offsets as the C loop reads them (float32, one per word), and their pointer."""
    if offsets is None:
        return None, None
    offsets = offsets.to(torch.float32).contiguous()
    if offsets.shape != (vocab,):
        raise AttnkitError(
            f"NCE needs one offset log k q(w) per word: {vocab}, not {len(offsets)}."
        )
    return offsets, offsets.data_ptr()


def _check(ids: Tensor, vocab: int, what: str) -> Tensor:
    """Ids the C loop may index with: int64, contiguous, in [0, vocab)."""
    ids = ids.to(torch.long).contiguous()
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise AttnkitError(f"{what} holds ids outside the {vocab} words of the vectors.")
    return ids


def update(
    vectors: Vectors,
    inputs: Tensor,
    target: int,
    negatives: Tensor,
    alpha: float,
    offsets: Tensor | None = None,
) -> float:
    """One update: the input vectors of `inputs` (their mean, for more than one) predict
    `target` against `negatives`, by NCE with `offsets` (log k q(w) per word); returns the
    loss before it."""
    vocab = len(vectors.inputs)
    if len(inputs) == 0:
        raise AttnkitError("an update needs at least one input word.")
    inputs, negatives = _check(inputs, vocab, "inputs"), _check(negatives, vocab, "negatives")
    _check(torch.tensor([target]), vocab, "target")
    work = torch.empty(2 * vectors.inputs.shape[1])
    offsets, pointer = _offsets(offsets, vocab)
    return _library().sgns_update(
        vectors.inputs.data_ptr(), vectors.outputs.data_ptr(), vectors.inputs.shape[1],
        inputs.data_ptr(), len(inputs), target, negatives.data_ptr(), len(negatives),
        alpha, pointer, work.data_ptr(),
    )  # fmt: skip


def train(
    vectors: Vectors,
    ids: Tensor,
    starts: Tensor,
    sampling: Sampling,
    alphas: tuple[float, float],
    seed: int,
    threads: int,
) -> tuple[float, int]:
    """One pass over the sentences `ids[starts[s]:starts[s + 1]]`, the rate going linearly
    from alphas[0] to alphas[1]; returns the summed loss and the number of updates."""
    ids, starts = _check(ids, len(vectors.inputs), "the corpus"), starts.to(torch.long).contiguous()
    if len(starts) == 0 or starts[0] != 0 or starts[-1] != len(ids) or (starts.diff() < 0).any():
        raise AttnkitError("sentence starts must rise from 0 to the number of word ids.")
    if threads < 1:
        raise AttnkitError(f"word2vec needs 1 thread or more, not {threads}.")
    pairs = ctypes.c_int64(0)
    _held, pointer = _offsets(sampling.offsets, len(vectors.inputs))  # alive through the call
    loss = _library().sgns_train(
        vectors.inputs.data_ptr(), vectors.outputs.data_ptr(), *vectors.inputs.shape,
        ids.data_ptr(), starts.data_ptr(), len(starts) - 1,
        sampling.keep.data_ptr(), sampling.own.data_ptr(), sampling.alias.data_ptr(),
        sampling.window, sampling.negative, int(sampling.cbow), pointer,
        alphas[0], alphas[1], seed % 2**64, threads, ctypes.byref(pairs),
    )  # fmt: skip
    if math.isnan(loss):
        raise AttnkitError("word2vec's C loop found no memory for its buffers.")
    return loss, pairs.value


def draw(own: Tensor, alias: Tensor, count: int, seed: int) -> Tensor:
    """`count` words drawn by the C loop's own sampler from an alias table."""
    out = torch.empty(count, dtype=torch.long)
    own, alias = own.double().contiguous(), alias.long().contiguous()
    _library().sgns_draw(
        own.data_ptr(), alias.data_ptr(), len(own), count, seed % 2**64, out.data_ptr()
    )
    return out
