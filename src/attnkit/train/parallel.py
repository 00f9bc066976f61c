"""Data parallelism: how the ranks hold the model. DDP replicates it, FSDP2 shards it.

With N ranks and P parameters trained by AdamW in float32 (4 bytes a weight, 4 its
gradient, 8 its two moments: 16 P bytes of training state):

    ddp   every rank holds all 16 P bytes; backward all-reduces the gradients to their mean
    fsdp  every rank holds 16 P / N: its 1/N slice of each weight, gradient and moment
          (torch's `fully_shard` on each `Block`, then on the root for the embeddings, the
          final norm and the head). A Block's weights are all-gathered before its forward
          (and again for its backward) and freed after; its gradients are reduce-scattered,
          each rank keeping the mean over the ranks of its slice (Rajbhandari et al. 2020,
          ZeRO stage 3; Zhao et al. 2023, PyTorch FSDP).

Both average, so the Trainer's scaling by N / (target tokens of the global batch) gives the
gradient of one big batch whichever runs, and AdamW (fused) updates each rank's slice.
Frozen weights (LoRA's or the adapters' base) are sharded like the others and get no
gradient. With `train.precision = "bf16"` FSDP gathers the weights in bfloat16
(`MixedPrecisionPolicy.param_dtype`): half the traffic and half the memory of the Block
held whole, while the shards, their gradients and AdamW stay float32 (the master weights).
`train.reduce_precision = "bf16"` also sums the gradients in bfloat16 (FSDP's
`reduce_dtype`, DDP's `bf16_compress_hook`): half the traffic, a sum rounded to 8 bits of
mantissa. FSDP runs in one process too, over a group of one: the same code on one device.

Readers of a run (`attnkit export hf`, `translate`) load one whole model, so under FSDP
rank 0 gathers it (`consolidated`) for every file the run folder keeps of the weights.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from attnkit.models import TransformerModel
from attnkit.models.block import Block
from attnkit.train.distributed import DistInfo
from attnkit.train.run_config import TrainSection

log = logging.getLogger(__name__)


class Parallel:
    """How this process holds the model it trains: `train.parallel` on `info`'s ranks.

    The Trainer calls `shard` before it builds the optimizer (FSDP's optimizer updates the
    shards) and `wrap` after it has loaded a checkpoint (DDP's wrapper sends rank 0's
    weights to the others).
    """

    def __init__(
        self, train: TrainSection, info: DistInfo, device: torch.device, precision: str
    ) -> None:
        self.kind, self.info, self.device = train.parallel, info, device
        self.param_dtype = torch.bfloat16 if precision == "bf16" else None
        self.reduce_bf16 = train.reduce_precision == "bf16"
        self._skeleton: nn.Module | None = None

    @property
    def sharded(self) -> bool:
        """Whether the model's weights and optimizer state are sharded (FSDP) on this run."""
        return self.kind == "fsdp"

    def shard(self, model: TransformerModel) -> None:
        """FSDP: shard `model` in place, each Block a unit of its own and the rest the root's.

        A copy of the model without weights is kept first (`consolidated` fills it).
        """
        if not self.sharded:
            return
        self._skeleton = _with_new_parameters(model, "meta")
        mesh = init_device_mesh(self.device.type, (self.info.world_size,))
        policy = MixedPrecisionPolicy(
            param_dtype=self.param_dtype,
            reduce_dtype=torch.bfloat16 if self.reduce_bf16 else torch.float32,
        )
        blocks = [m for m in model.modules() if isinstance(m, Block)]
        for block in blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        log.info(
            "FSDP: %d blocks and the root sharded over %d rank(s)%s",
            len(blocks),
            self.info.world_size,
            ", gathered in bf16" if self.param_dtype is not None else "",
        )

    def wrap(self, model: TransformerModel) -> nn.Module:
        """The module that runs forward: DDP's wrapper across ranks, else `model` itself."""
        if self.sharded or not self.info.active:
            return model
        ddp = DistributedDataParallel(
            model, device_ids=[self.device.index] if self.device.type == "cuda" else None
        )
        if self.reduce_bf16:
            ddp.register_comm_hook(None, bf16_compress_hook)
        return ddp

    def consolidated(self, model: TransformerModel) -> TransformerModel | None:
        """The whole model as one plain module: under FSDP, gathered onto rank 0's CPU (None on
        the other ranks, and every rank must call it); otherwise `model` itself."""
        if not self.sharded:
            return model
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        tensors = get_model_state_dict(model, options=options)  # rank 0's alone are filled
        if not self.info.is_main:
            return None
        whole = _with_new_parameters(self._skeleton, "cpu")
        whole.load_state_dict(tensors)
        return whole.train(model.training)

    @contextlib.contextmanager
    def gathered(self, model: TransformerModel) -> Iterator[None]:
        """Every weight of `model` whole on every rank while the block runs (evaluation).

        FSDP gathers a unit's weights only around its `forward`; decoding also reaches
        them through other methods (`encode`, `new_cache`, `decode_step`), token after
        token, so the whole model is gathered once instead: evaluation holds it whole.
        """
        if not isinstance(model, FSDPModule):
            yield
            return
        units = [m for m in model.modules() if isinstance(m, FSDPModule)]
        blocks = [m for m in units if m is not model]  # the root keeps FSDP's own setting
        for unit in blocks:
            unit.set_reshard_after_forward(False, recurse=False)
        for unit in units:
            unit.unshard()
        try:
            yield
        finally:
            for unit in units:
                unit.reshard()
            for unit in blocks:
                unit.set_reshard_after_forward(True, recurse=False)


def _with_new_parameters(model: nn.Module, device: str) -> nn.Module:
    """A deep copy of `model` whose parameters are new, unfilled tensors on `device` (a
    weight tied to another stays tied); buffers are copied."""
    memo = {
        id(p): nn.Parameter(torch.empty_like(p, device=device), requires_grad=p.requires_grad)
        for p in model.parameters()
    }
    return copy.deepcopy(model, memo)
