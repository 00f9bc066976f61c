"""The linear layer y = x W^T + b, with faster inference paths for a few rows on a CPU.

Every projection of the Transformer (Q, K, V, the output of attention, the two
layers of the feed-forward network, the pre-softmax head) is this map. In
training it multiplies thousands of rows at once and `F.linear` (MKL's sgemm
on a CPU) is as fast as the machine allows. A decoding step is different: it
multiplies one row per sentence (or per beam) by every weight matrix, so its
time is the time to read the weights, and there `F.linear` reads them slowly.

Without autograd, on float32 CPU tensors:

- up to `KERNEL_ROWS` rows, the C kernel of `few_rows.py` reads each row of W
  once and multiplies it by every row of x while those stay in the L1 cache;
- up to `FEW_ROWS` rows (or where the kernel is not built), the weight, as it
  is stored, is cut into its two halves of output features, and one batched
  product computes W_half x^T for both: each of two threads streams its own
  half of the weight, and the (out, rows) result is transposed back. The
  halves are a view, so nothing is copied or cached.

`python -m bench linear` measures both against `F.linear`. Anything that
needs gradients, another device or dtype, more rows, or is compiled runs
`F.linear`; every path computes the same function (tested).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.nn import few_rows

# Up to this many rows (a batch of 32 sentences with 4 beams) the halves were measured faster
# than F.linear at every size (bench/bench_linear.py: 1.8x at 1 row, 2.4x at 4, 1.4x at 8,
# 1.1x at 64, 1.06x at 128); at 256 rows F.linear was faster.
FEW_ROWS = 128
# Up to this many rows the kernel was measured faster than the halves (bench/bench_linear.py,
# speed-ups over F.linear, kernel and halves: 1.9x and 1.7x at 1 row, 3.6x and 2.5x at 4, 2.4x
# and 1.3x at 8, 1.2x and 1.0x at 20); at 24 rows they were even, at 32 the halves faster.
KERNEL_ROWS = 20


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, same state dict) with a faster path for small inference."""

    def forward(self, x: Tensor) -> Tensor:
        if self._few_rows_on_cpu(x):
            if x.numel() <= KERNEL_ROWS * self.in_features and self._kernel_takes_it():
                return few_rows.linear(x, self.weight, self.bias)
            if self.out_features % 2 == 0:
                return self._halves_product(x)
        return F.linear(x, self.weight, self.bias)

    def _kernel_takes_it(self) -> bool:
        return (
            self.weight.is_contiguous()
            and (self.bias is None or self.bias.is_contiguous())
            and few_rows.available()
        )

    def _halves_product(self, x: Tensor) -> Tensor:
        """(W x^T)^T with W in its two halves of output features, one per thread."""
        columns = x.reshape(-1, self.in_features).t().expand(2, -1, -1)  # (2, in, rows)
        halves = self.weight.view(2, -1, self.in_features)  # (2, out / 2, in), a view
        if self.bias is None:
            y = torch.bmm(halves, columns)
        else:
            y = torch.baddbmm(self.bias.view(2, -1, 1), halves, columns)
        return y.flatten(0, 1).t().contiguous().view(*x.shape[:-1], self.out_features)

    def _few_rows_on_cpu(self, x: Tensor) -> bool:
        # Under torch.compile the compiler picks its own kernels.
        return (
            not torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
            and x.device.type == "cpu"
            and x.dtype == torch.float32
            and self.weight.dtype == torch.float32
            and x.numel() <= FEW_ROWS * self.in_features
        )
