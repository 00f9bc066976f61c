"""Meta-device initialisation: build a model without its weights, shard it, then initialise.

    model = on_meta(config)                 # the weights on `meta`: shapes, no memory
    Parallel(...).shard(model)              # FSDP2: each rank's slices, still on meta
    materialize(model, device)              # to_empty: the slices allocated on `device`,
                                            # then the model's own initialisation

A 7B model's float32 weights are 28 GB; built whole and then sharded, each rank would hold
them all for a moment. Built on the meta device, a weight is a shape and a dtype: sharding
cuts shapes, and `to_empty` allocates only this rank's slice, which the model's own
initialisation then fills (each module's `reset_parameters`, the token and position tables'
normal draws, then `TransformerModel._init_weights`, in the order a normal build runs them:
in one process, with the same seed, the very same weights).

Only the weights go to meta. The tables computed from the shape (RoPE's cos and sin,
the sinusoidal positions, ALiBi's slopes) are buffers, small next to the weights; they are
computed on the CPU as usual, kept through `to_empty` (which would leave them unfilled) and
copied back. The build redirects `torch.empty` (what every weight of the model is made
from) to the meta device while the model is made; a weight made otherwise is moved there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel, build_model
from attnkit.nn.embedding import TokenEmbedding
from attnkit.nn.positional import AbsolutePositions

# Modules that draw their weights in their constructors rather than in `reset_parameters`:
# the draw each makes again, as the constructor made it (a scaled table has std d^-1/2).
_TABLES: dict[type, Any] = {
    TokenEmbedding: lambda m: nn.init.normal_(
        m.weight, std=m.weight.shape[1] ** -0.5 if m.scale != 1.0 else 0.02
    ),
    AbsolutePositions: lambda m: nn.init.normal_(m.table, std=0.02),
}


class _EmptyOnMeta(TorchFunctionMode):
    """`torch.empty` makes meta tensors: the weights' storage, and nothing else."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.empty:
            kwargs = {**kwargs, "device": "meta"}
        return func(*args, **kwargs)


@contextmanager
def _weights_on_meta() -> Iterator[None]:
    with _EmptyOnMeta():
        yield


def on_meta(config: ModelConfig) -> TransformerModel:
    """The model of `config` with every weight on the meta device and its buffers computed."""
    with _weights_on_meta():
        model = build_model(config)
    moved: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and not p.is_meta:  # made without torch.empty: moved, ties kept
                if id(p) not in moved:
                    moved[id(p)] = nn.Parameter(p.to("meta"), p.requires_grad)
                module._parameters[name] = moved[id(p)]
    for name, buffer in model.named_buffers():
        if buffer.is_meta:
            raise AttnkitError(f"the buffer {name} cannot be computed on the meta device")
    return model


def is_on_meta(model: nn.Module) -> bool:
    """Whether `model`'s weights are on the meta device (built by `on_meta`)."""
    return any(p.is_meta for p in model.parameters())


def materialize(model: TransformerModel, device: torch.device) -> None:
    """Allocate `model`'s (possibly sharded) weights on `device` and initialise them as a
    normal build of its config does; its buffers keep their values."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                owners.setdefault(id(p), []).append((module, name))
    model.to_empty(device=device)
    for (first, first_name), *others in owners.values():  # a tie to_empty undid: tied again
        for module, name in others:
            if module._parameters[name] is not first._parameters[first_name]:
                module._parameters[name] = first._parameters[first_name]
    with torch.no_grad():
        for name, value in buffers.items():
            model.get_buffer(name).copy_(value)
        _initialise(model)


def _initialise(model: TransformerModel) -> None:
    """The draws of a normal build, in its order: each module's own (constructors run inner
    modules first, as `modules()` lists them), then the model's `_init_weights`. A head tied
    to its table is untied meanwhile: a normal build initialises it before tying it."""
    head = getattr(model, "head", None)
    tied = head is not None and any(
        head.weight is m.weight for m in model.modules() if isinstance(m, TokenEmbedding)
    )
    shared = head.weight if tied else None
    if tied:
        head.weight = nn.Parameter(torch.empty_like(shared), shared.requires_grad)
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if type(module) in _TABLES and own:  # sinusoidal positions: a buffer, kept
            _TABLES[type(module)](module)
        elif hasattr(module, "reset_parameters"):
            module.reset_parameters()
        elif own:
            raise AttnkitError(
                f"meta initialisation does not know how to initialise {type(module).__name__}; "
                "set train.init_on_meta = false"
            )
    model._init_weights()
    if tied:
        head.weight = shared
