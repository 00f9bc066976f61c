"""How training compiles the model: torch.compile's mode, and CUDA graphs where they replay.

torch.compile fuses a step's small operations into fewer kernels; on a GPU a small model's
step is still bound by the host launching them (nanoGPT's Tiny Shakespeare recipe: 5.3 ms of
kernels in a 12 ms step). `reduce-overhead` records the step once as a CUDA graph and
replays it with one launch, which needs the same shapes every step: a language model's
batches of fixed blocks, not sentences of many lengths (a graph each), and one process (DDP's
and FSDP's collectives run between the graph's pieces). `auto` takes it exactly there.
"""

from __future__ import annotations

import torch

MODES = ("auto", "default", "reduce-overhead", "max-autotune")


def compile_mode(mode: str, device: torch.device, *, one_shape: bool, alone: bool) -> str:
    """`train.compile_mode` with `auto` resolved: `reduce-overhead` on a CUDA device for
    batches of one shape (`one_shape`) in one process (`alone`), torch's `default` elsewhere."""
    if mode != "auto":
        return mode
    return "reduce-overhead" if device.type == "cuda" and one_shape and alone else "default"
