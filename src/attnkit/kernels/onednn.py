"""float32 y = x W^T + b through oneDNN, where it beats torch's default (MKL) on this CPU.

On x86 torch multiplies float32 matrices with MKL's sgemm. On CPUs with
AVX-512 oneDNN's own float32 kernels (`torch.ops.mkldnn._linear_pointwise`,
exact float32: no bfloat16 or TF32 shortcut) are often faster: 10-20% at the
Transformer's shapes on one Zen 4 EPYC, up to 2x on a Zen 5 (bench/peak.py,
`python -m bench linear`). Which one wins depends on the CPU and the shape, so
nothing is assumed: the first product of each shape class (rows rounded up to
a power of two, in and out features, the path it competes with) times both on
random tensors of that shape and keeps the two times. oneDNN runs where it is
faster; in training only where its gain also pays for the autograd Function
around it (`TRAINING_COST_S`), which a small product's gain does not. The
times are kept on disk, per CPU model and torch version
(`loader.cache_dir()`), and read back by every later process: a training
resumed in a new process takes the same paths, so its float32 results stay
bit-identical to an uninterrupted run's.

Training goes through `OneDnnLinear`: forward and dL/dx = dL/dy W through
oneDNN, dL/dW = dL/dy^T x through MKL, which was faster for that product on
every shape measured. Only on CPUs with AVX-512 (elsewhere oneDNN brings no
float32 gain) and with `ATTNKIT_ONEDNN` not set to 0.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from attnkit.files import atomic_write
from attnkit.kernels import loader
from attnkit.kernels.cpu import this_cpu

logger = logging.getLogger(__name__)

Product = Callable[[Tensor, Tensor, Tensor | None], Tensor]
# Timed calls per candidate in a probe (after one untimed): the best of them counts.
PROBE_CALLS = 5
# Below this many multiply-adds a product is not worth a probe: a oneDNN call costs about
# 25 us however small (4 us for MKL at 40 x 16 x 32), and 0.3 ms the first time it meets a
# shape; at 2^20 an MKL product takes about 10 us.
MIN_MULTIPLY_ADDS = 1 << 20
# In training a product also pays for what the probe does not time: the autograd Function
# around it, its oneDNN dL/dx call and its dL/dW. Forward and backward at 16 x 8 x 8, where the
# products cost nothing, that is 170 us more than F.linear's (2 threads, Zen 4 EPYC). So a
# training product takes oneDNN only where the probe's gain, counted for the forward and for
# dL/dx, exceeds it: at the nanoGPT recipe's 768 x 128 x 512 oneDNN's forward gained about
# 50 us on this CPU, and routing such products through oneDNN cost 5% of that model's step
# (40.8 against 38.8 ms, medians of 21 alternating runs); at 1,024 x 512 x 512 it gained 0.3
# to 0.7 ms.
TRAINING_COST_S = 170e-6


@functools.cache
def enabled() -> bool:
    """Whether `Linear` may route float32 products here (AVX-512, oneDNN, not switched off)."""
    return (
        os.environ.get("ATTNKIT_ONEDNN", "1") != "0"
        and this_cpu().has("avx512f")
        and torch.backends.mkldnn.is_available()
    )


def _product(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class OneDnnLinear(torch.autograd.Function):
    """x W^T + b forward and dL/dx through oneDNN, dL/dW through MKL (see the module)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _product(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _product(grad, weight.t(), None)  # dL/dy W: W^T as oneDNN's weight
        rows = grad.reshape(-1, grad.shape[-1])
        if ctx.needs_input_grad[1]:
            grad_w = rows.t() @ x.reshape(-1, x.shape[-1])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = rows.sum(0)
        return grad_x, grad_w, grad_b


def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x W^T + b through oneDNN, differentiable (`OneDnnLinear`)."""
    return OneDnnLinear.apply(x, weight, bias)


# (rows class, out, in, bias, other's name) -> (oneDNN's seconds, other's seconds)
_times: dict[tuple, tuple[float, float]] | None = None


def faster(x: Tensor, weight: Tensor, bias: Tensor | None, other: tuple[str, Product]) -> bool:
    """Whether oneDNN beats `other` (a name and the product it would run) at x's shape class.

    Probed the first time the class is seen on this machine, on random tensors
    of its own generator, so no input's values matter; the times are kept, in
    memory and on disk. In training the gain must also pay `TRAINING_COST_S`.
    """
    rows = max(1, x.numel() // weight.shape[1])
    if rows * weight.numel() < MIN_MULTIPLY_ADDS:
        return False
    key = (1 << (rows - 1).bit_length(), *weight.shape, bias is not None, other[0])
    onednn_s, other_s = _measured(key, weight, bias, other[1])
    leaves = (x, weight, bias)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in leaves):
        return 2 * (other_s - onednn_s) > TRAINING_COST_S  # the forward and dL/dx
    return onednn_s < other_s


def _measured(
    key: tuple, weight: Tensor, bias: Tensor | None, other: Product
) -> tuple[float, float]:
    """The probe's times for `key`: known here, or on disk, or probed now.

    The disk is read again before a probe and its times win over this
    process's, so two processes that probe the same class at once still leave
    one answer for every later process (a resumed training takes its paths).
    """
    global _times
    if _times is None or key not in _times:
        _times = {**(_times or {}), **_read_times()}
    if key not in _times:
        probed = _probe(key[0], weight, bias, other)
        stored = _read_times()
        stored.setdefault(key, probed)
        _write_times(stored)
        _times.update(stored)
    return _times[key]


def times_file() -> Path:
    """Where this CPU's probe times are kept: one file per CPU model and torch version."""
    name = hashlib.sha256(f"{this_cpu().model}|{torch.__version__}".encode()).hexdigest()[:16]
    return loader.cache_dir() / f"onednn-times-{name}.json"


def _read_times() -> dict[tuple, tuple[float, float]]:
    try:
        stored = json.loads(times_file().read_text())
    except (OSError, ValueError):
        return {}
    return {tuple(json.loads(key)): tuple(value) for key, value in stored.items()}


def _write_times(times: dict[tuple, tuple[float, float]]) -> None:
    text = json.dumps({json.dumps(list(key)): list(value) for key, value in times.items()})
    try:
        times_file().parent.mkdir(parents=True, exist_ok=True)
        atomic_write(times_file(), lambda path: path.write_text(text))
    except (OSError, RuntimeError) as error:  # a read-only cache: probe again next time
        logger.debug("oneDNN probe times not kept: %s", error)


def _probe(rows: int, weight: Tensor, bias: Tensor | None, other: Product) -> tuple[float, float]:
    """oneDNN's and `other`'s best seconds for a forward product of `rows` rows."""
    # A generator of its own: drawing from torch's would change a training's dropout
    # masks depending on when a probe ran (and a resumed run would not repeat it).
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, weight.shape[1], generator=generator)
    w = torch.randn(weight.shape, generator=generator)
    b = None if bias is None else torch.randn(bias.shape, generator=generator)
    # The two alternate, after one untimed call each, and take turns going first, so a
    # passing slowdown of the machine, a first call's page faults or the caches the other
    # left touch both alike; the best call of each counts.
    best = {_product: float("inf"), other: float("inf")}
    with torch.no_grad():
        for call in range(PROBE_CALLS + 1):
            for product in list(best)[:: 1 if call % 2 else -1]:
                start = time.perf_counter()
                product(x, w, b)
                if call:
                    best[product] = min(best[product], time.perf_counter() - start)
    return best[_product], best[other]


def probe_times() -> dict[tuple, tuple[float, float]]:
    """The times known: (rows class, out, in, bias, other's name) -> (oneDNN's, other's) seconds."""
    return dict(_times or {})
