"""LoRA: low-rank adaptation of a frozen linear layer (Hu et al., 2021, eq. 3).

    h = x W^T + b + (alpha / r) * dropout(x) A^T B^T,    A: (r, in),  B: (out, r)

Fine-tuning changes a pretrained W by an update whose rank is low in practice,
so LoRA trains that update in factored form, B A, and keeps W and b frozen: a
layer trains r (in + out) numbers instead of in * out, and the optimizer keeps
state for those alone. B starts at zero, so an adapted model computes exactly
what the base model did until the first step; A starts as `nn.Linear` starts
its weight. alpha / r keeps the size of the update about the same when r changes.

`merge` folds the update into the weight, W <- W + (alpha / r) B A, so the
merged model decodes at the base model's cost; `merge_lora` does so for a whole
model and puts the plain linear layers back, which is what a run folder stores.
"""

from __future__ import annotations

import copy
import fnmatch
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.errors import AttnkitError

# The attention projections of every attention layer (self and cross), as the paper adapts.
ATTENTION_PROJECTIONS = ("*qkv_proj", "*q_proj", "*kv_proj", "*out_proj")


class LoRALinear(nn.Module):
    """A frozen `nn.Linear` (`base`) plus a trainable rank-`rank` update B A scaled by alpha / r."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        if rank < 1:
            raise AttnkitError(f"LoRA rank must be at least 1, got {rank}")
        if alpha <= 0:
            raise AttnkitError(f"LoRA alpha must be positive, got {alpha}")
        if not 0 <= dropout < 1:
            raise AttnkitError(f"LoRA dropout must be in [0, 1), got {dropout}")
        self.base = base.requires_grad_(False)
        self.rank, self.alpha = rank, alpha
        # A buffer, so a checkpoint's tensors alone can be merged (`merge_lora_tensors`).
        self.register_buffer("scaling", torch.tensor(alpha / rank, dtype=base.weight.dtype))
        weight = base.weight
        self.lora_A = nn.Parameter(weight.new_empty(rank, base.in_features))
        self.lora_B = nn.Parameter(weight.new_zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.dropout = nn.Dropout(dropout)
        self.merged = False

    def forward(self, x: Tensor) -> Tensor:
        y = self.base(x)
        if self.merged:
            return y
        # Two thin products (x A^T, then B): never the full (out, in) update.
        return y + F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B) * self.scaling

    def delta_weight(self) -> Tensor:
        """The update (alpha / r) B A, shaped like the base weight."""
        return _update(self.lora_A, self.lora_B, self.scaling)

    @torch.no_grad()
    def merge(self) -> None:
        """W <- W + (alpha / r) B A; forward then runs the base layer alone."""
        if not self.merged:
            self.base.weight += self.delta_weight().to(self.base.weight.dtype)
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """Undo `merge`, so training can go on with the update kept apart."""
        if self.merged:
            self.base.weight -= self.delta_weight().to(self.base.weight.dtype)
            self.merged = False

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}, merged={self.merged}"


def _update(a: Tensor, b: Tensor, scaling: Tensor) -> Tensor:
    return (b @ a) * scaling


def has_lora(model: nn.Module) -> bool:
    return any(isinstance(m, LoRALinear) for m in model.modules())


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent, _, child = name.rpartition(".")
    return (model.get_submodule(parent) if parent else model), child


def apply_lora(
    model: nn.Module,
    rank: int = 8,
    alpha: float = 16.0,
    dropout: float = 0.0,
    targets: Sequence[str] = ATTENTION_PROJECTIONS,
) -> list[str]:
    """Freeze `model` and wrap each `nn.Linear` whose name matches a pattern of `targets`.

    Patterns are shell-style over the dotted module names (`*w_1` is the first
    layer of every feed-forward network, `decoder.*` every linear layer of the
    decoder). Afterwards only the LoRA factors require gradients. Returns the
    names of the adapted layers.
    """
    if has_lora(model):
        raise AttnkitError("this model already has LoRA layers; merge_lora it first")
    linears = {
        name: module for name, module in model.named_modules() if isinstance(module, nn.Linear)
    }
    chosen = [n for n in linears if any(fnmatch.fnmatchcase(n, p) for p in targets)]
    if not chosen:
        examples = ", ".join(list(linears)[:4])
        raise AttnkitError(
            f"no linear layer matches {list(targets)}; linear layers are named like {examples}"
        )
    head = getattr(model, "head", None)
    if any(linears[n] is head for n in chosen):
        raise AttnkitError(
            "LoRA on the output head is not supported: the head is tied to the token embedding "
            "and the fused loss reads its weight directly; leave it out of the targets"
        )
    # Every wrapper is made (and its settings checked) before the model is touched.
    wrappers = {name: LoRALinear(linears[name], rank, alpha, dropout) for name in chosen}
    model.requires_grad_(False)
    for name, wrapper in wrappers.items():
        parent, child = _parent(model, name)
        setattr(parent, child, wrapper)
    return chosen


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every LoRA update into its weight and put the plain linear layers back, in place.

    The result has the base model's modules and state-dict names, so it saves,
    loads, exports and decodes as any model does. Its parameters stay frozen.
    """
    for name, module in list(model.named_modules()):
        if isinstance(module, LoRALinear):
            module.merge()
            parent, child = _parent(model, name)
            setattr(parent, child, module.base)
    return model


def merged_copy(model: nn.Module) -> nn.Module:
    """`model` itself when it has no LoRA layers, otherwise a merged deep copy of it."""
    return merge_lora(copy.deepcopy(model)) if has_lora(model) else model


def lora_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """Only the LoRA tensors: what a fine-tuning adds to a base model (load with strict=False)."""
    return {
        name: tensor
        for name, tensor in model.state_dict().items()
        if name.endswith((".lora_A", ".lora_B", ".scaling"))
    }


def merge_lora_tensors(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """The same merge on a state dict (a checkpoint file): the base model's names and weights.

    Each `P.base.weight` with `P.lora_A`, `P.lora_B` and `P.scaling` becomes
    `P.weight` = W + scaling B A, and `P.base.bias` becomes `P.bias`.
    """
    merged = dict(tensors)
    for name in tensors:
        if not name.endswith(".lora_A"):
            continue
        prefix = name.removesuffix(".lora_A")
        a, b = merged.pop(f"{prefix}.lora_A"), merged.pop(f"{prefix}.lora_B")
        scaling = merged.pop(f"{prefix}.scaling")
        weight = merged.pop(f"{prefix}.base.weight")
        merged[f"{prefix}.weight"] = weight + _update(a, b, scaling).to(weight.dtype)
        if f"{prefix}.base.bias" in merged:
            merged[f"{prefix}.bias"] = merged.pop(f"{prefix}.base.bias")
    return merged
