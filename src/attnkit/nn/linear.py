"""The linear layer y = x W^T + b, with faster inference paths for a few rows on a CPU.

Every projection of the Transformer (Q, K, V, the output of attention, the two
layers of the feed-forward network, the pre-softmax head) is this map. In
training it multiplies thousands of rows at once and `F.linear` (MKL's sgemm
on a CPU) is as fast as the machine allows. A decoding step is different: it
multiplies one row per sentence (or per beam) by every weight matrix, so its
time is the time to read the weights, and there `F.linear` reads them slowly.

Without autograd, on float32 CPU tensors:

- up to `KERNEL_ROWS` rows, the C kernel of `kernels/few_rows.py` reads each row of W
  once and multiplies it by every row of x while those stay in the L1 cache;
- up to `FEW_ROWS` rows (or where the kernel is not built), the weight, as it
  is stored, is cut into its two halves of output features, and one batched
  product computes W_half x^T for both: each of two threads streams its own
  half of the weight, and the (out, rows) result is transposed back. The
  halves are a view, so nothing is copied or cached.

On CPUs with AVX-512, training and the products past the kernel go through
oneDNN instead of the halves or `F.linear` wherever a probe of that shape
found it faster (`kernels/onednn.py`). `python -m bench linear` measures every path
against `F.linear`. Another device or dtype, autocast, or torch.compile runs
`F.linear`; every path computes the same function (tested).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.kernels import few_rows, onednn

# Up to this many rows (a batch of 32 sentences with 4 beams) the halves were measured faster
# than F.linear at every size (bench/bench_linear.py: 1.8x at 1 row, 2.4x at 4, 1.4x at 8,
# 1.1x at 64, 1.06x at 128); at 256 rows F.linear was faster.
FEW_ROWS = 128
# Up to this many rows the kernel was measured faster than the halves (bench/bench_linear.py,
# speed-ups over F.linear, kernel and halves: 1.9x and 1.7x at 1 row, 3.6x and 2.5x at 4, 2.4x
# and 1.3x at 8, 1.2x and 1.0x at 20); at 24 rows they were even, at 32 the halves faster.
KERNEL_ROWS = 20


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, same state dict) with faster paths on a CPU."""

    def forward(self, x: Tensor) -> Tensor:
        if not self._plain_float32_on_cpu(x):
            return F.linear(x, self.weight, self.bias)
        rows = x.numel() // self.in_features
        if rows == 0:
            return F.linear(x, self.weight, self.bias)
        inference = not torch.is_grad_enabled()
        if inference and rows <= KERNEL_ROWS and self._kernel_takes_it():
            return few_rows.linear(x, self.weight, self.bias)
        halves = inference and rows <= FEW_ROWS and self.out_features % 2 == 0
        other = ("halves", self._halves_product) if halves else ("F.linear", F.linear)
        if onednn.enabled() and onednn.faster(x, self.weight, self.bias, other):
            return onednn.linear(x, self.weight, self.bias)
        return other[1](x, self.weight, self.bias)

    def _kernel_takes_it(self) -> bool:
        return (
            self.weight.is_contiguous()
            and (self.bias is None or self.bias.is_contiguous())
            and few_rows.available()
        )

    @staticmethod
    def _halves_product(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """(W x^T)^T with W in its two halves of output features, one per thread."""
        out, features = weight.shape
        columns = x.reshape(-1, features).t().expand(2, -1, -1)  # (2, in, rows)
        halves = weight.view(2, -1, features)  # (2, out / 2, in), a view
        if bias is None:
            y = torch.bmm(halves, columns)
        else:
            y = torch.baddbmm(bias.view(2, -1, 1), halves, columns)
        return y.flatten(0, 1).t().contiguous().view(*x.shape[:-1], out)

    def _plain_float32_on_cpu(self, x: Tensor) -> bool:
        # Under torch.compile the compiler picks its own kernels; under autocast F.linear
        # must run so that autocast can lower its precision.
        return (
            not torch.compiler.is_compiling()
            and not torch.is_autocast_enabled("cpu")
            and x.device.type == "cpu"
            and x.dtype == torch.float32
            and self.weight.dtype == torch.float32
        )
