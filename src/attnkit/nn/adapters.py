"""Adapters: small bottleneck layers trained inside a frozen model (Houlsby et al., 2019).

    Adapter(h) = h + W_up f(W_down h + b_down) + b_up,   W_down: (m, d),  W_up: (d, m)

Each block gets one after each attention sub-layer and one after its
feed-forward network, applied to the sub-layer's output before the residual
sum (figure 2 of the paper). With the bottleneck m much smaller than d_model
a block trains 2 m d + m + d numbers per adapter, and the base model stays as
it is, so one frozen model serves many tasks, each with its own adapters.
W_up and b_up start at zero, so a model with new adapters computes exactly
what the base model did (the paper starts near zero; exactly zero keeps the
equality testable), and W_down starts as `nn.Linear` starts its weight. The
paper also trains the layer norms; here everything but the adapters stays
frozen, so the base model is shared unchanged.

Unlike LoRA an adapter cannot be folded into a weight (f is not linear), so
adapters are part of the architecture: `ModelConfig.adapter_size` builds them,
a run folder saves them with the model, and `adapter_state_dict` gives them
apart from the base weights (the run folder also writes them alone, in
adapters.safetensors).
"""

from __future__ import annotations

import dataclasses

from torch import Tensor, nn

from attnkit.errors import AttnkitError
from attnkit.nn.linear import Linear


class Adapter(nn.Module):
    """h + up(gelu(down(h))), `up` at zero: the identity until trained."""

    def __init__(self, d_model: int, size: int) -> None:
        super().__init__()
        self.down = Linear(d_model, size)
        self.up = Linear(size, d_model)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)
        self.activation = nn.GELU()

    def forward(self, h: Tensor) -> Tensor:
        return h + self.up(self.activation(self.down(h)))


def apply_adapters(model: nn.Module, size: int) -> int:
    """Freeze `model`, give every block its adapters of bottleneck `size`; return how many.

    The model's config records `adapter_size`, so it saves and loads with them.
    """
    if size < 1:
        raise AttnkitError(f"the adapters' bottleneck size must be at least 1, got {size}")
    if model.config.adapter_size:
        raise AttnkitError("this model already has adapters; train those, or start from its base")
    model.requires_grad_(False)
    parameter = next(model.parameters())
    for block in [m for m in model.modules() if hasattr(m, "add_adapters")]:
        block.add_adapters(size)
    model.to(parameter.device, parameter.dtype)
    model.config = dataclasses.replace(model.config, adapter_size=size)
    return sum(isinstance(m, Adapter) for m in model.modules())


def adapter_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """Only the adapters' tensors: what an adapter fine-tuning adds to its base model."""
    return {name: t for name, t in model.state_dict().items() if "adapter." in name}
