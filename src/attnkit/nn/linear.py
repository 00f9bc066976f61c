"""The linear layer y = x W^T + b, with a faster inference path for a few rows on a CPU.

Every projection of the Transformer (Q, K, V, the output of attention, the two
layers of the feed-forward network, the pre-softmax head) is this map. In
training it multiplies thousands of rows at once and `F.linear` (MKL's sgemm
on a CPU) is as fast as the machine allows. A decoding step is different: it
multiplies one row per sentence (or per beam) by every weight matrix, so its
time is the time to read the weights. For that case oneDNN's inner product on
a copy of the weight repacked once into oneDNN's blocked layout is faster.
For up to four rows (greedy decoding of a few prompts) a plainer layout is
faster still: the output features cut into two blocks, each stored as a
contiguous (in, out / 2) matrix, multiplied by one batched product, so each of
two threads streams its own half of the weight. `python bench/bench_linear.py`
measures all three on the decoder's matrices.

A packed copy is made on the first call without autograd and kept until the
weight changes, so it costs one extra copy of the weights while a model
decodes (two if it decodes both few and many rows). A change is an in-place
write that bumps the weight's version (a checkpoint load) or any optimizer
step: fused optimizers such as `AdamW(fused=True)`, which the trainer uses,
write the parameters without bumping their version, so a global hook counts
every `optimizer.step()`. Anything that needs gradients, another device or
dtype, more than `FEW_ROWS` rows, or is compiled runs `F.linear` unchanged;
all paths compute the same function (tested).
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
# Up to this many rows the two-block layout was measured as fast as oneDNN's or faster (1.0x at
# 1 and 4 rows, 1.3x to 1.5x at 2); at 8 rows it was 5% to 10% slower (bench/bench_linear.py).
SPLIT_ROWS = 4

_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")

_optimizer_steps = 0


def _count_optimizer_step(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


register_optimizer_step_post_hook(_count_optimizer_step)


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, same state dict) with oneDNN's path for small inference."""

    _packed: dict[str, tuple[tuple[int, int, int], Tensor]] | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self._few_rows_on_cpu(x):
            if x.numel() <= SPLIT_ROWS * self.in_features and self.out_features % 2 == 0:
                return self._two_block_product(x)
            return torch.ops.mkldnn._linear_pointwise(
                x, self._packed_weight("onednn"), self.bias, "none", [], ""
            )
        return F.linear(x, self.weight, self.bias)

    def _two_block_product(self, x: Tensor) -> Tensor:
        rows = x.reshape(1, -1, self.in_features)
        blocks = self._packed_weight("two-block")  # (2, in, out / 2)
        if self.bias is None:
            y = torch.bmm(rows.expand(2, -1, -1), blocks)
        else:
            y = torch.baddbmm(self.bias.view(2, 1, -1), rows.expand(2, -1, -1), blocks)
        return y.transpose(0, 1).reshape(*x.shape[:-1], self.out_features)

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

    def _packed_weight(self, layout: str) -> Tensor:
        """The weight in `layout`, repacked whenever the weight itself has changed."""
        weight = self.weight
        key = (weight.data_ptr(), weight._version, _optimizer_steps)
        if self._packed is None:
            self._packed = {}
        cached = self._packed.get(layout)
        if cached is None or cached[0] != key:
            w = weight.detach()
            if layout == "onednn":
                packed = torch.ops.mkldnn._reorder_linear_weight(w, 1)
            else:  # two blocks of output features, each (in, out / 2) and contiguous
                packed = w.view(2, -1, self.in_features).transpose(1, 2).contiguous()
            self._packed[layout] = cached = (key, packed)
        return cached[1]
