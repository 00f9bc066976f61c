"""Weights in 8 bits for a GPU's decoding: int8 weight-only, and float8 (e4m3) products.

A decoding step at a small batch multiplies a few rows by every weight matrix, so its time
is the time to read the weights: halving their bytes nearly halves the step. Both layers
hold W in 8 bits with one scale per output channel,

    s_o = max_k |W_ok| / M,    q_ok = W_ok / s_o  (rounded to int8, or to float8 e4m3),

M = 127 for int8 and 448 (e4m3's largest value) for float8, and return y in the dtype x came
in (bfloat16 on a GPU):

- `WeightOnlyInt8Linear` (`int8-weights`): x stays bfloat16, q is widened to it inside the
  product and the scale applied to the output, y_ro = s_o sum_k x_rk q_ok (gpt-fast's
  `WeightOnlyInt8Linear`). Under torch.compile, as the static cache's compiled step runs it,
  the widening fuses into the product's loads, so a step reads one byte a weight.
- `Float8Linear` (`fp8`): x is quantized to e4m3 on its own scale at every call,
  s_x = max |x| / 448, and the product runs on float8 tensor cores (`torch._scaled_mm`,
  GPUs of compute capability 8.9 and up), summed in float32: y_ro = s_o s_x sum_k x8_rk q_ok.
  Layers whose sizes are not multiples of 16 (what the float8 product needs) stay as they are.

Both run on the CPU too (the tests compare them there with a float reference and with
torch's own `_weight_int8pack_mm`), though there `int8` (`int8_linear.py`) is the fast path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.nn.int8_linear import quantize_per_channel

FLOAT8 = torch.float8_e4m3fn
FLOAT8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
# The float8 product needs both sizes of W to be multiples of this.
FLOAT8_MULTIPLE = 16


class WeightOnlyInt8Linear(nn.Module):
    """y = (x q^T) s + b: W in int8 per output channel, x and y in their own dtype."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        dtype = _float_dtype(linear.weight)
        q, scale = quantize_per_channel(linear.weight)
        # Buffers, not parameters: a converted model is for inference.
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale.to(dtype))
        bias = None if linear.bias is None else linear.bias.detach().to(dtype).clone()
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight.to(x.dtype)) * self.scale.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def weight_bytes(self) -> int:
        """A byte a weight, and the scales and bias in their dtype."""
        extra = [self.scale] + ([] if self.bias is None else [self.bias])
        return self.weight.numel() + sum(t.numel() * t.element_size() for t in extra)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


def quantize_float8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(q, s): e4m3 q and float32 s, one per output row, with W ~ q * s[:, None]."""
    scale = weight.detach().abs().amax(dim=1).float() / FLOAT8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays zero
    return (weight.detach().float() / scale[:, None]).to(FLOAT8), scale


def float8_fits(linear: nn.Linear) -> bool:
    """Whether the float8 product takes `linear`'s sizes."""
    return linear.in_features % FLOAT8_MULTIPLE == 0 and linear.out_features % FLOAT8_MULTIPLE == 0


class Float8Linear(nn.Module):
    """y = (x8 q^T) s_x s + b on float8 tensor cores: W in e4m3 per output channel, x
    quantized to e4m3 on one scale at each call."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.out_dtype = _float_dtype(linear.weight)
        q, scale = quantize_float8(linear.weight)
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).float()
        n = rows.shape[0]
        x_scale = (rows.abs().amax() / FLOAT8_MAX).clamp_min(1e-12)
        # Rows padded to a multiple of 16 too, which some versions of the product need.
        rows = F.pad(rows, (0, 0, 0, -n % FLOAT8_MULTIPLE))
        x8 = (rows / x_scale).clamp(-FLOAT8_MAX, FLOAT8_MAX).to(FLOAT8)
        one = torch.ones((), device=x.device)
        # W's scales are per output channel: they multiply the float32 sums afterwards, so the
        # product itself takes one scale a side, as every float8 GPU does.
        y = torch._scaled_mm(x8, self.weight.t(), x_scale, one, out_dtype=torch.float32)[:n]
        y = y * self.scale
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def weight_bytes(self) -> int:
        extra = 0 if self.bias is None else 4 * self.out_features
        return self.weight.numel() + 4 * self.out_features + extra

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8"


def _float_dtype(weight: Tensor) -> torch.dtype:
    """The dtype a converted layer keeps its scales and bias in: the weight's, if floating."""
    return weight.dtype if weight.dtype.is_floating_point else torch.float32
