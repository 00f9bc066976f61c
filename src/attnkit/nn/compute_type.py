"""Compute types for decoding: every linear layer in float32, int8, bfloat16 or 8-bit weights.

A decoding step's time is nearly all in its linear layers (Q, K, V, the output
of attention, the feed-forward network, the pre-softmax head), and their speed
is set by how many bytes of weight they read and how many products the CPU
does per cycle; both change with the number format. `convert` swaps each
`Linear` of a loaded model for one of:

- `Int8Linear` (`int8`, `int8_linear.py`): W in int8, one scale per output
  channel; each row of activations quantized on its own scale at every call, the
  products exact in integers (the project's C kernel for decoding's few rows,
  torch's `_int_mm` or FBGEMM for more), as CTranslate2's `int8` does. Weights
  take a quarter of their float32 bytes. (Weights alone in int8, activations
  kept in float32, were measured too: torch's kernel for that,
  `_weight_int8pack_mm`, ran 5 to 40 times slower than float32 here;
  `python -m bench linear`.)
- `BFloat16Linear` (`bf16`): W and b stored in bfloat16 (8 bits of
  mantissa), x rounded to bfloat16 at the input, products accumulated in
  float32 (oneDNN), the output rounded to bfloat16 and handed on as float32.
  Only on CPUs with bfloat16 dot products (AVX512-BF16 or AMX) or on a CUDA
  device: elsewhere torch runs bfloat16 through a fallback slower than
  float32, so it is refused.

- `WeightOnlyInt8Linear` (`int8-weights`) and `Float8Linear` (`fp8`), for a GPU
  (`weight_only.py`): W in 8 bits per output channel, x in bfloat16; int8 widened inside
  the compiled step's product, float8 multiplied on the tensor cores of GPUs of compute
  capability 8.9 and up (`torch._scaled_mm`). Half of bfloat16's bytes a weight.

With int8 the token embeddings are held in int8 too (`Int8Embedding`, one
scale per row; a table tied to the head shares the head's int8 matrix).
Everything else (positions, norms, attention's softmax, the KV cache) stays
float32. `auto` picks, per machine, the fastest type whose quality loss stays
within the bound measured in the README (int8: BLEU within 0.3 of float32 on
Multi30k): int8 where FBGEMM runs, else bf16 where the CPU has it, else float32.
Training never converts; the converted model is for inference only.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.errors import AttnkitError
from attnkit.kernels.cpu import this_cpu
from attnkit.nn.embedding import TokenEmbedding
from attnkit.nn.int8_linear import Int8Embedding, Int8Linear
from attnkit.nn.weight_only import Float8Linear, WeightOnlyInt8Linear, float8_fits

log = logging.getLogger(__name__)

COMPUTE_TYPES = ("float32", "int8", "bf16", "int8-weights", "fp8", "auto")


class BFloat16Linear(nn.Module):
    """y = x W^T + b with W, b and x in bfloat16, the products summed in float32, y rounded
    to bfloat16 (then float32 for the layers after)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # Buffers, not parameters: a converted model is for inference, and its own copy.
        self.register_buffer("weight", linear.weight.detach().to(torch.bfloat16).clone())
        bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16).clone()
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x.to(torch.bfloat16), self.weight, self.bias).to(x.dtype)

    def weight_bytes(self) -> int:
        return 2 * self.weight.numel() + (0 if self.bias is None else 2 * self.bias.numel())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bf16"


CONVERTERS = {
    "int8": Int8Linear,
    "bf16": BFloat16Linear,
    "int8-weights": WeightOnlyInt8Linear,
    "fp8": Float8Linear,
}
# Float8 lowest compute capability: Ada (8.9) and Hopper have float8 tensor cores.
FLOAT8_CAPABILITY = (8, 9)


def refusal(compute_type: str, device: torch.device) -> str | None:
    """Why `compute_type` cannot run on `device` here, in one sentence, or None if it can."""
    if compute_type not in COMPUTE_TYPES:
        return f"compute type {compute_type!r} is not one of {', '.join(COMPUTE_TYPES)}"
    if compute_type == "int8":
        if device.type != "cpu":
            return "compute type 'int8' runs on the CPU; on CUDA use int8-weights or bf16"
        if not this_cpu().has("avx2"):
            return "compute type 'int8' needs an x86 CPU with AVX2; use float32"
        fbgemm = "fbgemm" in torch.backends.quantized.supported_engines
        if not this_cpu().has("avx512_vnni") and not fbgemm:
            return "compute type 'int8' needs torch's FBGEMM kernels on this CPU; use float32"
    if compute_type in ("int8-weights", "fp8") and device.type != "cuda":
        return f"compute type {compute_type!r} is for a CUDA GPU; on the CPU use int8"
    if compute_type == "fp8" and torch.cuda.get_device_capability(device) < FLOAT8_CAPABILITY:
        return (
            "compute type 'fp8' needs a GPU with float8 tensor cores (compute capability 8.9 or "
            "up: L4, H100, H200); use int8-weights"
        )
    if compute_type == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            return "compute type 'bf16' needs a GPU with bfloat16; use float32"
        if device.type == "cpu" and not this_cpu().bf16_dot:
            return (
                "compute type 'bf16' needs a CPU with AVX512-BF16 or AMX (this one would run it "
                "through a fallback slower than float32); use int8 or float32"
            )
    return None


def resolve(compute_type: str, device: torch.device) -> str:
    """The concrete type `compute_type` means on `device`; one that cannot run raises."""
    if compute_type == "auto":
        order = ("int8", "bf16") if device.type == "cpu" else ("bf16",)
        return next((t for t in order if refusal(t, device) is None), "float32")
    if reason := refusal(compute_type, device):
        raise AttnkitError(reason)
    return compute_type


def convert(model: nn.Module, compute_type: str) -> str:
    """Swap `model`'s linear layers (in place) for `compute_type`'s; return the type used.

    The model must be in eval mode: a converted layer has no gradients. A
    LoRA layer's base is converted like any layer and its factors stay float32,
    so it decodes unmerged; merge LoRA before converting to fold them in (a
    converted base has no float32 weight left to merge into). A converted
    model is not saved (`save_pretrained` refuses it): load the run again.
    """
    device = next(model.parameters()).device
    chosen = resolve(compute_type, device)
    if chosen == "float32":
        return chosen
    if model.training:
        raise AttnkitError(f"compute type {chosen!r} is for inference: call model.eval() first")
    make = CONVERTERS[chosen]
    converted = {}
    for parent, name, child in _children(model, nn.Linear):
        if chosen == "fp8" and not float8_fits(child):
            continue  # the float8 product takes sizes in multiples of 16 only
        if child.in_features >= 2:  # one input feature stays float32: the guard row needs two
            converted[id(child.weight)] = made = make(child).to(device)
            setattr(parent, name, made)
    if chosen == "int8":
        # The token tables too, in int8; a table tied to the head reads the head's int8 copy.
        for parent, name, child in _children(model, TokenEmbedding):
            setattr(parent, name, Int8Embedding(child, converted.get(id(child.weight))).to(device))
    return chosen


def _children(model: nn.Module, kind: type) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, name, child) for every submodule of `model` of type `kind`, listed before any
    is replaced."""
    return [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, kind)
    ]


def compute_type_of(model: nn.Module) -> str:
    """The type `convert` gave `model`'s linear layers: float32 if it converted none."""
    for module in model.modules():
        for name, kind in CONVERTERS.items():
            if isinstance(module, kind):
                return name
    return "float32"


def linear_weight_bytes(model: nn.Module) -> int:
    """Bytes the linear layers' weights and biases hold resident, in whatever type they are."""
    total = 0
    for module in model.modules():
        if isinstance(module, Int8Linear | BFloat16Linear | WeightOnlyInt8Linear | Float8Linear):
            total += module.weight_bytes()
        elif isinstance(module, nn.Linear):
            total += sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
    return total
