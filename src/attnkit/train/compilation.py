"""How training compiles the model: torch.compile's mode, and CUDA graphs where they replay.

torch.compile fuses a step's small operations into fewer kernels; on a GPU a small model's
step is still bound by the host launching them (nanoGPT's Tiny Shakespeare recipe: 5.3 ms of
kernels in a 12 ms step). `reduce-overhead` records the step once as a CUDA graph and
replays it with one launch, which needs the same shapes every step: a language model's
batches of fixed blocks, not sentences of many lengths (a graph each), and one process (DDP's
and FSDP's collectives run between the graph's pieces). `auto` takes it exactly there.

`train.compile_scope = "block"` compiles each `Block` on its own, in place
(`nn.Module.compile`, so the state dict keeps its names), as torchtitan does under FSDP2:
a Block is FSDP's unit, whose gathers and reduce-scatters then run between the compiled
Blocks, and the Blocks of one shape share one compiled graph.
"""

from __future__ import annotations

import torch
from torch import nn

from attnkit.models.block import Block

MODES = ("auto", "default", "reduce-overhead", "max-autotune")


def compile_mode(mode: str, device: torch.device, *, one_shape: bool, alone: bool) -> str:
    """`train.compile_mode` with `auto` resolved: `reduce-overhead` on a CUDA device for
    batches of one shape (`one_shape`) in one process (`alone`), torch's `default` elsewhere."""
    if mode != "auto":
        return mode
    return "reduce-overhead" if device.type == "cuda" and one_shape and alone else "default"


def compile_blocks(model: nn.Module, mode: str) -> int:
    """Compile every `Block` of `model` in place with torch.compile's `mode`; how many."""
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    for block in blocks:
        block.compile(mode=mode)
    return len(blocks)
