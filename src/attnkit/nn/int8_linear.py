"""int8 linear layers: y = x W^T + b with W and each row of x in 8-bit integers.

W is quantized once, symmetric, one scale per output channel,
    s_o = max_k |W_ok| / 127,   q_ok = round(W_ok / s_o),
and each row of x on its own scale at every call,
    s_r = max_k |x_rk| / Q,     q_rk = round(x_rk * (Q / max_k |x_rk|)),
so the product runs in integers and is exact,
    y_ro = ((q_r . q_o) s_o) s_r + b_o,
as CTranslate2's `int8` does. Q is 127, or 63 on CPUs without AVX512-VNNI, whose
byte products (FBGEMM's vpmaddubsw) saturate 16-bit sums unless one side has 7
bits. A row quantized on its own scale gives the same result alone, in any batch
or position, cached or not; the paths below compute the very same float32
operations, so that holds bit for bit whichever runs it:

- up to `int8_rows.KERNEL_ROWS` rows (decoding steps): the project's C kernel,
  which reads the int8 W once, as stored (`int8_rows.c`);
- more rows, with AVX512-VNNI: torch's exact int8 product `_int_mm` on the same
  int8 W (without VNNI, torch 2.13's `_int_mm` saturates: wrong sums, so not used);
- more rows, without VNNI: FBGEMM's dynamic product on a packed copy of W.
  FBGEMM quantizes its float input on the range it sees; the rows are handed to
  it already quantized (whole numbers in [-Q, Q]) together with a guard row
  [Q, -Q-1, 0, ...], so its range is [-Q-1, Q] on 2Q+1 levels, its scale 1 and
  its quantization the identity. Its output is then (q_r . q_o) s_o.

The token embedding is an int8 table of the same form, one scale per row,
    E[i] ~ q_i s_i,
read row by row (`Int8Embedding`); where it is tied to the head it reads the
head's own int8 weight and scales, so the matrix is held once, in int8, as
CTranslate2 holds it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.kernels import int8_rows
from attnkit.kernels.cpu import this_cpu
from attnkit.nn.embedding import check_ids

INT8_MAX = 127
# under a row's peak, so that levels / peak stays finite and a row of zeros stays zeros
PEAK_FLOOR = 1e-30  # the C kernel's too


def quantize_per_channel(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(q, s): int8 q and float32 s, one per output row, with W ~ q * s[:, None]."""
    scale = weight.detach().abs().amax(dim=1).float() / INT8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays zero
    q = torch.round(weight.detach().float() / scale[:, None]).clamp(-INT8_MAX, INT8_MAX)
    return q.to(torch.int8), scale


def dequantize(q: Tensor, scale: Tensor) -> Tensor:
    """The float32 weight that `q` and `scale` stand for."""
    return q.float() * scale[:, None]


@dataclass(frozen=True)
class Int8Path:
    """How an `Int8Linear` computes: the C kernel's build for few rows (None: none), the
    many-row product (`int_mm` or `fbgemm`) and Q, the activations' largest level."""

    kernel: str | None
    many: str
    levels: int


def int8_path() -> Int8Path:
    """The fastest exact path on this CPU (see the module's docstring)."""
    if this_cpu().has("avx512_vnni"):
        return Int8Path(int8_rows.best(), "int_mm", INT8_MAX)
    return Int8Path(int8_rows.best(), "fbgemm", 63)


class Int8Linear(nn.Module):
    """`linear` with W in int8 per output channel and x quantized per row at each call."""

    def __init__(self, linear: nn.Linear, path: Int8Path | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.path = path or int8_path()
        q, scale = quantize_per_channel(linear.weight)
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale)
        # vpdpbusd multiplies unsigned bytes: the kernel stores q + 128 and takes this off.
        self.register_buffer("offset", 128 * q.sum(dim=1, dtype=torch.int32))
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.register_buffer("bias", bias)
        self._packed = self._pack(q, scale) if self.path.many == "fbgemm" else None

    def _pack(self, q: Tensor, scale: Tensor) -> object:
        guard = torch.zeros(1, self.in_features)
        guard[0, 0], guard[0, -1] = self.path.levels, -self.path.levels - 1
        self.register_buffer("guard", guard, persistent=False)
        with warnings.catch_warnings():
            # torch marks its quantized tensor types deprecated; FBGEMM's packed weight is
            # still built from one (torch 2.13), and nothing else of them is used.
            warnings.simplefilter("ignore", UserWarning)
            zero_points = torch.zeros(self.out_features, dtype=torch.long)
            qweight = torch._make_per_channel_quantized_tensor(q, scale.double(), zero_points, 0)
        return torch.ops.quantized.linear_prepack(qweight, None)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).float().contiguous()
        p = self.path
        if p.kernel is not None and rows.shape[0] <= int8_rows.KERNEL_ROWS:
            y = int8_rows.linear(
                rows, self.weight, self.offset, self.scale, self.bias, p.levels, p.kernel
            )
        else:
            y = self._many_rows(rows)
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def _many_rows(self, rows: Tensor) -> Tensor:
        # The kernel's float32 steps: q_r, then ((q_r . q_o) s_o) s_r + b_o; in its C file where
        # it is built (one pass each, where torch takes six small operations), else one by one.
        p = self.path
        if p.kernel is not None:
            q, row_scale = int8_rows.quantize_rows(rows, p.levels, p.kernel)
        else:
            peak = rows.abs().amax(dim=1, keepdim=True).clamp_min_(PEAK_FLOOR)
            q = rows.mul(torch.full_like(peak, p.levels) / peak).round_()  # levels / peak, divided
            row_scale = peak / p.levels
        if p.many == "int_mm":
            dots = torch._int_mm(q.to(torch.int8), self.weight.t())
            if p.kernel is not None:
                return int8_rows.rescale(dots, self.scale, row_scale, self.bias, p.kernel)
            y = dots.float().mul_(self.scale)
        else:
            scaled = torch.cat([q.float(), self.guard])
            y = torch.ops.quantized.linear_dynamic(scaled, self._packed, True)[:-1]
        y = y.mul_(row_scale)
        return y if self.bias is None else y.add_(self.bias)

    def weight_bytes(self) -> int:
        """int8 weights (twice where FBGEMM keeps its packed copy), a float32 scale per output,
        the kernel's int32 offsets and the float32 bias if any."""
        copies = 1 if self._packed is None else 2
        biases = 0 if self.bias is None else 4 * self.out_features
        return copies * self.in_features * self.out_features + 8 * self.out_features + biases

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class Int8Embedding(nn.Module):
    """ids -> (q[ids] * s[ids]) * scale: a token embedding held in int8, one scale per row.

    Built from a `TokenEmbedding`; with `head`, the `Int8Linear` made from the same
    (tied) matrix, it reads the head's int8 weight and scales instead of its own.
    """

    def __init__(self, token: nn.Module, head: Int8Linear | None = None) -> None:
        super().__init__()
        self.vocab_size, self.scale_factor = token.vocab_size, token.scale
        # With a head, the very tensors of the head: the matrix is held once.
        q, scale = quantize_per_channel(token.weight) if head is None else (head.weight, head.scale)
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale)

    def forward(self, ids: Tensor) -> Tensor:
        check_ids(ids, self.vocab_size)
        out = self.weight[ids].float() * self.scale[ids, None]
        return out * self.scale_factor if self.scale_factor != 1.0 else out

    def extra_repr(self) -> str:
        return f"{self.vocab_size}, {self.weight.shape[1]}, int8"
