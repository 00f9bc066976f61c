"""Attention of a decoding step in one C call (`step_attention.c`), over the cache as it lies.

    out_i = softmax(q_i K^T / sqrt(d_k) + bias_i + mask_i) V      (section 3.2.1)

A decoding step asks little of each (row, head): one query over the cached keys
(self-attention), or a sentence's beams over its source (cross-attention). At
beam search's 128 rows x 8 heads, torch spends about a microsecond per tiny
product in `bmm`, twice, plus the softmax between; this kernel does the three
at once per (row, head), reading the keys and values in place through any
strides. It also reads them through beam search's history table (`rows`, see
`KVCache.reorder`), so the cache is never copied when beams change parents.

Every query must be allowed every key by the attention's own structure (one new
position in a causal stack, or cross-attention): there is no causal flag; masks
and biases are applied as given. A query with every key masked gets zeros.
Built for x86-64 CPUs with AVX2 and FMA; with `ATTNKIT_STEP_ATTENTION=0`,
elsewhere or when the build fails (one warning), `available()` is False and
attention takes its torch paths.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
from pathlib import Path

import torch
from torch import Tensor

from attnkit.kernels import loader

SOURCE = Path(__file__).with_name("step_attention.c")
FLAGS = (*loader.BASE_FLAGS, *loader.AVX2_FLAGS)
_SIZE, _POINTER = ctypes.c_int64, ctypes.c_void_p


class _Args(ctypes.Structure):
    """The C file's `step_attention_args`, field for field."""

    _fields_ = [
        *((name, _POINTER) for name in ("q", "k", "v", "rows", "mask", "bias", "out")),
        ("q_strides", _SIZE * 3),
        ("kv_strides", _SIZE * 3),
        ("rows_stride", _SIZE),
        ("mask_strides", _SIZE * 2),
        ("bias_strides", _SIZE * 3),
        *((name, _SIZE) for name in ("batch", "heads", "kv_heads", "queries", "keys", "d")),
        ("scale", ctypes.c_float),
    ]


@functools.cache
def _kernel():
    """The C function, or None where it is not built (see the module's docstring)."""
    if os.environ.get("ATTNKIT_STEP_ATTENTION", "1") == "0" or not loader.avx2_cpu():
        return None
    library = loader.load(SOURCE, FLAGS, "decoding's attention runs in torch operations")
    if library is None:
        return None
    function = library.step_attention
    function.argtypes = [ctypes.POINTER(_Args), ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def available() -> bool:
    """Whether `attend` can run on this machine (the first call builds or loads the kernel)."""
    return _kernel() is not None


def runs_on(device: torch.device) -> bool:
    """Whether `attend` runs here now: a CPU, the kernel built, inference, and no compiler or
    exporter tracing (which sees no data to hand to C)."""
    eager = not torch.is_grad_enabled() and not torch.compiler.is_compiling()
    return device.type == "cpu" and eager and available()


def runs(q: Tensor, k: Tensor) -> bool:
    """Whether `attend` takes these: float32 tensors where `runs_on` their device."""
    return q.dtype == k.dtype == torch.float32 and runs_on(q.device)


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rows: Tensor | None = None,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """(batch, queries, heads * d_k) attention of q (batch, heads, queries, d_k) over k and v.

    k, v: (batch, kv_heads, keys, d_k), or, with `rows` (batch, keys) int64, the
    cache's (cache rows, kv_heads, >= keys, d_k) with row b's key p in row rows[b, p].
    mask: bool, True where allowed, broadcastable to (batch, 1, queries, keys).
    bias: float, broadcastable to (batch, heads, queries, keys).
    Only where `runs(q, k)`.
    """
    batch, heads, queries, d = q.shape
    keys = k.shape[2] if rows is None else rows.shape[1]
    if heads % k.shape[1] or v.dtype != torch.float32:
        raise ValueError(f"{heads} query heads over {k.shape[1]} key heads, values {v.dtype}")
    q, k, v = (_last_contiguous(t) for t in (q, k, v))
    if k.stride() != v.stride():  # the kernel reads both at one set of strides
        k, v = k.contiguous(), v.contiguous()
    out = torch.empty(batch, queries, heads * d, dtype=torch.float32)
    args = _Args(
        q=q.data_ptr(),
        k=k.data_ptr(),
        v=v.data_ptr(),
        out=out.data_ptr(),
        q_strides=(_SIZE * 3)(*q.stride()[:3]),
        kv_strides=(_SIZE * 3)(*k.stride()[:3]),
        batch=batch,
        heads=heads,
        kv_heads=k.shape[1],
        queries=queries,
        keys=keys,
        d=d,
        scale=1 / math.sqrt(d),
    )
    if rows is not None:
        rows = _last_contiguous(rows)
        args.rows, args.rows_stride = rows.data_ptr(), rows.stride(0)
    if mask is not None:
        mask = _last_contiguous(mask.to(torch.bool).expand(batch, 1, queries, keys))
        args.mask = mask.data_ptr()
        args.mask_strides = (_SIZE * 2)(mask.stride(0), mask.stride(2))
    if bias is not None:
        bias = _last_contiguous(bias.to(torch.float32).expand(batch, heads, queries, keys))
        args.bias = bias.data_ptr()
        args.bias_strides = (_SIZE * 3)(*bias.stride()[:3])
    if _kernel()(ctypes.byref(args), torch.get_num_threads()):
        raise MemoryError(f"no memory for the scores of {keys} keys")
    return out


def _last_contiguous(t: Tensor) -> Tensor:
    """`t` where its last dimension is contiguous, else a contiguous copy (strides 0 kept)."""
    return t if t.stride(-1) == 1 else t.contiguous()
