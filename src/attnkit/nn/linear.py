"""The linear layer y = x W^T + b, with a faster inference path for a few rows on a CPU.

Every projection of the Transformer (Q, K, V, the output of attention, the two
layers of the feed-forward network, the pre-softmax head) is this map. In
training it multiplies thousands of rows at once and `F.linear` (MKL's sgemm
on a CPU) is as fast as the machine allows. A decoding step is different: it
multiplies one row per sentence (or per beam) by every weight matrix, so its
time is the time to read the weights. For that case oneDNN's inner product on
a copy of the weight repacked once into oneDNN's blocked layout is faster:
`python bench/bench_linear.py` measures it against `F.linear` on the decoder's
matrices.

The packed copy is made on the first call without autograd and kept until the
weight changes, so it costs one extra copy of the weights while a model
decodes. A change is an in-place write that bumps the weight's version (a
checkpoint load) or any optimizer step: fused optimizers such as
`AdamW(fused=True)`, which the trainer uses, write the parameters without
bumping their version, so a global hook counts every `optimizer.step()`.
Anything that needs gradients, another device or dtype, more than `FEW_ROWS` rows, or is
compiled runs `F.linear` unchanged; both paths compute the same function (tested).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

# Up to this many rows (a batch of 64 sentences with 4 beams) the packed weight was measured
# faster at every size by bench/bench_linear.py: 1.5x for 1 to 4 rows, 1.2x for 8 to 256.
# Beyond it a product is compute-bound and `F.linear` needs no extra copy of the weight.
FEW_ROWS = 256

_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")

_optimizer_steps = 0


def _count_optimizer_step(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


register_optimizer_step_post_hook(_count_optimizer_step)


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, same state dict) with oneDNN's path for small inference."""

    _packed: tuple[tuple[int, int, int], Tensor] | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self._few_rows_on_cpu(x):
            return torch.ops.mkldnn._linear_pointwise(
                x, self._packed_weight(), self.bias, "none", [], ""
            )
        return F.linear(x, self.weight, self.bias)

    def _few_rows_on_cpu(self, x: Tensor) -> bool:
        # Under torch.compile the compiler picks its own kernels; the packed weight is a
        # side effect it cannot trace.
        return (
            _ONEDNN
            and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
            and x.device.type == "cpu"
            and x.dtype == torch.float32
            and self.weight.dtype == torch.float32
            and x.numel() <= FEW_ROWS * self.in_features
        )

    def __getstate__(self) -> dict:
        # The packed weight is a cache, and an opaque oneDNN tensor can be neither copied nor
        # pickled: copies (`copy.deepcopy`, `torch.save` of the module) leave it out.
        state = self.__dict__.copy()
        state.pop("_packed", None)
        return state

    def _packed_weight(self) -> Tensor:
        """The weight in oneDNN's layout, repacked whenever the weight itself has changed."""
        weight = self.weight
        key = (weight.data_ptr(), weight._version, _optimizer_steps)
        if self._packed is None or self._packed[0] != key:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)
            self._packed = (key, packed)
        return self._packed[1]
