"""Activation checkpointing: keep less of the forward pass for backward, recompute the rest.

Backward needs what each Block computed on the way forward; kept whole, that is the
largest part of training memory at long context (per layer about 34 s b d bytes in
bf16 for s tokens of b sequences, Korthikanti et al. 2022, table 2). Recomputing trades it
for time (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"):

    none       every Block keeps all it saves for backward
    block      each Block keeps only its input; its forward runs again inside backward
               (about one more forward pass: ~1/3 more compute)
    selective  each Block keeps the outputs of its matrix products and attention, the
               costly ops, and recomputes the cheap ones between them (norms,
               activations, dropout, residual sums): less memory kept than `none`, far
               less recompute than `block` (Korthikanti et al. 2022; torchtitan's "op" mode)

Both run through torch's non-reentrant `torch.utils.checkpoint.checkpoint`
(`use_reentrant=False`), which restores the random state before recomputing, so
dropout draws the same masks and the gradients are those of the plain forward pass,
bit for bit on the same device. It wraps each Block's `forward` in place, so the
parameters keep their names (checkpoints, optimizer groups, FSDP's units are unchanged);
FSDP's hooks stay outside the recomputation, which finds the Block's weights already
gathered for backward.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from attnkit.checks import choice
from attnkit.models.block import Block

MODES = ("none", "block", "selective")

_aten = torch.ops.aten
# The ops whose outputs `selective` keeps: the products (a linear layer is one of the first
# three) and the fused attention kernels. Everything else in a Block is recomputed.
SAVED_OPS = frozenset(
    {
        _aten.mm.default,
        _aten.addmm.default,
        _aten.bmm.default,
        _aten.baddbmm.default,
        _aten._scaled_dot_product_flash_attention.default,
        _aten._scaled_dot_product_flash_attention_for_cpu.default,
        _aten._scaled_dot_product_efficient_attention.default,
        _aten._scaled_dot_product_cudnn_attention.default,
    }
)


def _keep_products(ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def apply_activation_checkpointing(model: nn.Module, mode: str) -> int:
    """Checkpoint every Block of `model` as `mode` says (`MODES`); returns how many.

    Call it once, before sharding or compiling the model.
    """
    choice("train.activation_checkpointing", mode, MODES)
    if mode == "none":
        return 0
    options: dict[str, object] = {"use_reentrant": False}
    if mode == "selective":
        options["context_fn"] = functools.partial(
            create_selective_checkpoint_contexts, _keep_products
        )
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    for block in blocks:
        # An instance attribute is what `nn.Module.__call__` runs, between the module's hooks.
        block.forward = functools.partial(checkpoint, block.forward, **options)
    return len(blocks)
