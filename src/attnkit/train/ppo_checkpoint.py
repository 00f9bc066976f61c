"""A PPO run's checkpoint: what `attnkit train --resume` needs to continue a `ppo` run as if it
had never stopped (`attnkit.train.ppo_task` runs it).

    RUN_DIR/checkpoints/step-N/model.safetensors  the policy at step N (LoRA factors apart, as
                                                  a supervised run's step checkpoint keeps them)
    RUN_DIR/model.safetensors, value_head.safetensors  the policy merged, and its value head:
                                                  what every other command reads
    RUN_DIR/trainer_state.pt                      task "ppo", the step, the value head, AdamW's
                                                  state, the random states, the settings and
                                                  the reference's fingerprint

A step is one PPO iteration, saved whole or not at all: its rollouts are used up by its own
updates, so nothing of them is kept. The random states are those the step left (torch's, which
sampling draws from, and the minibatch order's generator), taken before any evaluation, and the
prompt batches continue where they stopped (one a step), so a run stopped and resumed gives the
weights of one that ran through. The frozen reference is train.init_from's model, which a
resume builds again as the start did; the SHA-256 of its weights, recorded at the start,
refuses a resume whose train.init_from has changed since (the KL penalty would be to another
model).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import Any

import torch
from torch import nn

from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel
from attnkit.run import RunFolder
from attnkit.train import checkpoint as ckpt
from attnkit.train.run_config import RunConfig

log = logging.getLogger(__name__)

TASK = "ppo"


def fingerprint(model: nn.Module) -> str:
    """The SHA-256 of `model`'s weights and buffers, by name, in their bytes."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        flat = tensor.detach().cpu().contiguous().reshape(-1)  # a 0-d tensor has no byte view
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def settings(config: RunConfig) -> dict[str, Any]:
    """What a resumed PPO run must keep: the [ppo] section, the optimiser's settings, the seed,
    the batch of prompts and the start. train.steps, saving, logging and evaluation may change."""
    c = config.train
    fixed = ("seed", "init_from", "lr", "weight_decay", "beta1", "beta2", "eps", "clip_norm")
    return {
        "ppo": dataclasses.asdict(config.ppo),
        "data.batch_size": config.data.batch_size,
        **{f"train.{name}": getattr(c, name) for name in fixed},
    }


@dataclasses.dataclass
class Saved:
    """What a PPO step leaves to resume from: the step and the random states it ended with."""

    step: int
    rng: dict[str, Any]
    generator: torch.Tensor


def after_step(step: int, generator: torch.Generator) -> Saved:
    """The state after `step`, before an evaluation draws anything."""
    return Saved(step, ckpt.rng_state(), generator.get_state())


def save(
    folder: RunFolder,
    policy: TransformerModel,
    value_head: nn.Module,
    optimizer: torch.optim.Optimizer,
    saved: Saved,
    run: dict[str, Any],
    keep_last: int,
) -> None:
    """Write the checkpoint of `saved.step`; `run` holds the settings and the fingerprint."""
    state = {
        "task": TASK,
        "step": saved.step,
        "rng": saved.rng,
        "generator": saved.generator,
        "value_head": {k: v.detach().cpu() for k, v in value_head.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        **run,
    }
    ckpt.save_checkpoint(folder, policy, state, keep_last)  # the trainer state last


def restore(
    folder: RunFolder,
    policy: TransformerModel,
    value_head: nn.Module,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    run: dict[str, Any],
    steps: int,
) -> int:
    """Load the latest checkpoint of a PPO run into its pieces; the step it saved. Refused,
    before anything is loaded or written: a folder without one, another task's, a step past
    `steps` (train.steps), changed settings or another reference."""
    state = ckpt.load_trainer_state(folder)
    if state.get("task") != TASK:
        other = f"a {state['task']} run" if state.get("task") else "a supervised run"
        raise AttnkitError(f"{folder.root} holds {other}, not a ppo run; choose another out_dir")
    step = state["step"]
    if step > steps:
        raise AttnkitError(
            f"{folder.root} stopped at step {step:,}, past train.steps {steps:,}, so resuming "
            f"would train nothing; give train.steps above {step:,} to train on "
            "(--set train.steps=N), or use the run as it is"
        )
    changed = [k for k, v in run["settings"].items() if state["settings"].get(k) != v]
    if changed:
        raise AttnkitError(
            f"{folder.root} was trained with other {', '.join(changed)}; resume with the "
            "settings the run started with, or start a new run"
        )
    if state["reference"] != run["reference"]:
        raise AttnkitError(
            f"train.init_from's weights are not those {folder.root} started from, and they are "
            "its frozen reference; resume with the model the run started from"
        )
    ckpt.load_step(folder, policy, step)
    value_head.load_state_dict(state["value_head"])
    optimizer.load_state_dict(state["optimizer"])
    generator.set_state(state["generator"])
    ckpt.set_rng_state(state["rng"])
    # steps recorded after the last save are run again: their records go
    folder.write_metrics(r for r in folder.read_metrics() if r["step"] <= step)
    log.info("resuming the ppo run at step %d", step)
    return step
