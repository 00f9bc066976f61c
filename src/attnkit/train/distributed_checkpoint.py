"""Sharded checkpoints: under FSDP each rank writes and reads its own slices.

    RUN_DIR/checkpoints/step-0000500/model.safetensors   the whole model, gathered by rank 0
    RUN_DIR/checkpoints/step-0000500/sharded/            the weights and AdamW's moments in
        slices: one `__R_0.distcp` file per rank R and a `.metadata` that maps every slice

AdamW's two moments are 8 of the 16 bytes a parameter costs in training; under FSDP they
exist only in slices, and each rank writes its own at the same time through
`torch.distributed.checkpoint` (DCP), keyed by parameter name. A resume on any number of
ranks, sharded or not, reads for each rank the parts of the saved slices that overlap what
it now holds (DCP reshards on load); the same world size reads exactly what it wrote, so
the run continues bit for bit. A checkpoint of a run without FSDP (whole weights, the
optimizer's state in trainer_state.pt) resumes under FSDP too: each rank keeps its slices.

A save goes into a temporary folder that rank 0 renames to `sharded/` once every rank has
written its file and rank 0 the metadata (DCP's save ends when all have), and before the
trainer state names the step (`attnkit.train.checkpoint.save_checkpoint`): a rank that dies
mid-save leaves the checkpoint before it the latest, and whole.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import FSDPModule

from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel
from attnkit.run import RunFolder
from attnkit.train import distributed as dist
from attnkit.weights import read_weights

log = logging.getLogger(__name__)

_METADATA = ".metadata"  # what DCP writes last, on rank 0: a sharded checkpoint is whole with it


def save_shards(
    folder: RunFolder, step: int, model: TransformerModel, optimizer: torch.optim.Optimizer
) -> None:
    """Every rank writes its slices of `model` and `optimizer` as the sharded checkpoint of
    `step` (one that was there is replaced whole); every rank must call it."""
    target = folder.step_shards(step)
    stage = None
    if dist.from_env().is_main:
        # A name `remove_cut_writes` knows as the leftover of a save cut short.
        stage = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
        stage.mkdir(parents=True)
    stage = dist.broadcast_object(stage)
    weights, moments = get_state_dict(model, optimizer)
    dcp.save({"model": weights, "optimizer": moments}, checkpoint_id=stage)
    if dist.from_env().is_main:
        if target.exists():
            shutil.rmtree(target)
        os.replace(stage, target)


def restore(
    folder: RunFolder,
    state: dict[str, Any],
    model: TransformerModel,
    optimizer: torch.optim.Optimizer,
) -> None:
    """Load the checkpoint whose trainer state is `state` into `model` and `optimizer`, each
    sharded or not, from a sharded checkpoint or a whole one.

    The weights of a whole checkpoint were loaded into a model that is not sharded by
    `attnkit.train.checkpoint.resume`; this loads the rest.
    """
    step = state["step"]
    if state["optimizer"] is None:  # saved sharded
        shards = folder.step_shards(step)
        if not (shards / _METADATA).is_file():
            raise AttnkitError(
                f"{folder.root} has a trainer state for step {step} but no whole sharded "
                f"checkpoint at {shards}; the run folder is incomplete"
            )
        weights, moments = get_state_dict(model, optimizer)
        saved = {"model": weights, "optimizer": moments}
        alone = not torch.distributed.is_initialized()  # a plain resume reads every slice itself
        with warnings.catch_warnings():  # which DCP warns of even when told (`no_dist`)
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.load(saved, checkpoint_id=shards, no_dist=alone)
        set_state_dict(
            model, optimizer, model_state_dict=saved["model"], optim_state_dict=saved["optimizer"]
        )
    elif isinstance(model, FSDPModule):  # saved whole, resumed sharded: each rank takes its part
        set_state_dict(
            model,
            optimizer,
            model_state_dict=read_weights(folder.step_weights(step)),
            optim_state_dict=_by_name(state["optimizer"], model, optimizer),
            # Not strict: the file holds a tied weight under one of its names (`save_model`).
            options=StateDictOptions(full_state_dict=True, strict=False),
        )
    else:
        optimizer.load_state_dict(state["optimizer"])


def _by_name(
    saved: dict[str, Any], model: TransformerModel, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """`optimizer.state_dict()` of a run that was not sharded, keyed by parameter names (as
    DCP keys it) rather than by the parameters' places in the optimizer's groups.

    The places are those of the same model and groups, so they name the same parameters.
    """
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    return {
        "state": {order[i]: moments for i, moments in saved["state"].items()},
        "param_groups": [
            {**group, "params": [order[i] for i in group["params"]]}
            for group in saved["param_groups"]
        ],
    }
