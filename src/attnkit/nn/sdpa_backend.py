"""Which of torch's fused attention kernels computes softmax(Q K^T / sqrt(d_k) + M) V.

`F.scaled_dot_product_attention` dispatches to one of several kernels for the
same function: FlashAttention (Dao et al. 2022: tiles of Q, K and V in fast
memory, the softmax computed online, the (length x length) scores never
written out), memory-efficient attention (Rabe and Staats 2021, xFormers'
kernel), cuDNN's, or the plain "math" composition of matmul and softmax. On a
CPU torch has its own flash kernel, which takes masks too; on a GPU flash takes
no mask at all, only the causal flag, so attnkit passes the flag rather than a
dense mask wherever the flag says the same (`models/stack.py`).

`attention_backend` (a `ModelConfig` field, auto by default) restricts the
dispatch to one kernel through `torch.nn.attention.sdpa_kernel`; inputs that
kernel cannot take are refused in one sentence. `kernels_run` reports which
kernels a piece of work called, from torch's profiler.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnkit.errors import AttnkitError

# The kernel each of `ModelConfig`'s `attention_backend` choices (`ATTENTION_BACKENDS`) names.
BACKENDS: dict[str, SDPBackend | None] = {
    "auto": None,
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}

# The ATen operators behind each kernel, as the profiler names them.
KERNELS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
}


def fused_attention(q: Tensor, k: Tensor, v: Tensor, backend: str = "auto", **options) -> Tensor:
    """`F.scaled_dot_product_attention(q, k, v, **options)` on the kernel `backend` names."""
    chosen = BACKENDS[backend]
    if chosen is None:
        return F.scaled_dot_product_attention(q, k, v, **options)
    try:
        with sdpa_kernel([chosen]):
            return F.scaled_dot_product_attention(q, k, v, **options)
    except RuntimeError as error:
        if "No available kernel" not in str(error) and "No viable backend" not in str(error):
            raise
        mask = "a mask" if options.get("attn_mask") is not None else "no mask"
        raise AttnkitError(
            f"attention_backend {backend!r} cannot run this attention on {q.device.type} "
            f"({q.dtype}, {mask}, head size {q.shape[-1]}); use 'auto' to let torch choose"
        ) from None


def kernels_run(work: Callable[[], object]) -> Counter[str]:
    """How many times each attention kernel ran during `work()` (on the CPU and CUDA)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        work()
    return Counter(
        {
            KERNELS[event.key]: event.count
            for event in profile.key_averages()
            if event.key in KERNELS
        }
    )
