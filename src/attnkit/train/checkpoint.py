"""Checkpoints: a run folder that survives crashes and resumes exactly.

    RUN_DIR/config.json, model.safetensors   the model to use (latest, or the final average)
    RUN_DIR/trainer_state.pt                 optimizer, scheduler, scaler, step, RNG
                                             states, data position, best metric
    RUN_DIR/checkpoints/step-0000500/        the weights at each saved step (last K kept)
    RUN_DIR/checkpoints/best/                the weights with the best validation metric

The paths are `attnkit.run.RunFolder`'s; what goes in them is decided here.

Resuming refuses a checkpoint whose model config differs from the model's,
with one allowance: the decoding ids (`eos_id`, `decoder_start_id`) only tell
`generate` where to start and stop, and runs trained before models recorded
them saved None. A resume accepts that None and the run records the ids from
then on; a saved id that differs still refuses (it means another tokenizer).

A step checkpoint keeps LoRA factors apart (`attnkit.nn.lora`), so training
resumes with them; every other weights file holds the merged, plain model.

Every file is written to a temporary name and renamed (`attnkit.files.atomic_write`),
and the trainer state names the step whose weights it goes with, written only
after those weights: a crash at any point leaves the previous checkpoint whole.
Averaging the last N checkpoints (section 6.1: the base model averaged the
last 5) takes the element-wise mean of their (merged) weights.
"""

from __future__ import annotations

import logging
import random
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file, save_model
from torch import Tensor

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.files import atomic_write
from attnkit.models import TransformerModel
from attnkit.nn.lora import merge_lora_tensors, merged_copy
from attnkit.run import RunFolder, load_weights, save_pretrained

log = logging.getLogger(__name__)

_DECODING_IDS = ("eos_id", "decoder_start_id")


def rng_state() -> dict[str, Any]:
    """Every random generator the training loop draws from, as plain Python values.

    Plain values (bytes, lists) pass both `torch.load(weights_only=True)` and the
    pickling of `all_gather_object`, which collects every rank's state.
    """
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (kind, keys.tolist(), pos, has_gauss, gauss),
        "torch": _to_bytes(torch.get_rng_state()),
        "cuda": [_to_bytes(s) for s in torch.cuda.get_rng_state_all()]
        if torch.cuda.is_available()
        else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(_from_bytes(state["torch"]))
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_from_bytes(s) for s in state["cuda"]])


def _to_bytes(t: Tensor) -> bytes:
    return t.cpu().numpy().tobytes()


def _from_bytes(b: bytes) -> Tensor:
    return torch.frombuffer(bytearray(b), dtype=torch.uint8)


def save_checkpoint(
    run_dir: str | Path, model: TransformerModel, state: dict[str, Any], keep_last: int
) -> Path:
    """Write the weights of `state["step"]`, then the trainer state, then the latest model.

    Older step checkpoints beyond the newest `keep_last` are removed last.
    """
    folder = RunFolder(run_dir)
    step = state["step"]
    atomic_write(folder.step_weights(step), lambda p: save_model(model, str(p)))
    atomic_write(folder.trainer_state, lambda p: torch.save(state, p))
    save_pretrained(model, folder.root)
    for old in folder.saved_steps()[:-keep_last]:
        if old != step:
            shutil.rmtree(folder.step_dir(old), ignore_errors=True)
    return folder.step_dir(step)


def save_best(run_dir: str | Path, model: TransformerModel) -> Path:
    return atomic_write(
        RunFolder(run_dir).best_weights, lambda p: save_model(merged_copy(model), str(p))
    )


def load_trainer_state(run_dir: str | Path) -> dict[str, Any]:
    """The trainer state of a run folder; weights_only loading, so it runs no pickled code."""
    path = RunFolder(run_dir).trainer_state
    if not path.is_file():
        raise AttnkitError(
            f"{run_dir} has no {path.name} to resume from; start a new run without --resume"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise AttnkitError(f"{path} cannot be read ({err}); it is not a trainer state") from None


def load_checkpoint(run_dir: str | Path, model: TransformerModel) -> dict[str, Any]:
    """Load the weights of the latest saved step into `model`; return its trainer state."""
    state = load_trainer_state(run_dir)
    weights = RunFolder(run_dir).step_weights(state["step"])
    if not weights.is_file():
        raise AttnkitError(
            f"{run_dir} has a trainer state for step {state['step']} but no weights at {weights}; "
            "the run folder is incomplete"
        )
    load_weights(model, weights)
    return state


def resume(
    run_dir: str | Path, model: TransformerModel, rank: int, world_size: int
) -> dict[str, Any]:
    """Load the latest checkpoint into `model` and this rank's RNG state; return the trainer state.

    Each rank continues from the RNG state the same rank saved, so a run resumed on as many
    processes continues bit for bit.
    """
    state = load_trainer_state(run_dir)
    _check_fits(state["model_config"], model.config, run_dir)
    load_checkpoint(run_dir, model)
    rngs = state["rng"]
    if len(rngs) != world_size:
        log.warning(
            "the run was saved by %d processes and resumes on %d: it continues, but not "
            "bit-for-bit",
            len(rngs),
            world_size,
        )
    set_rng_state(rngs[rank % len(rngs)])
    return state


def _check_fits(saved: dict[str, Any], config: ModelConfig, run_dir: str | Path) -> None:
    """Refuse to resume the checkpoint of a model config `saved` with `config`, naming a field."""
    here = config.to_dict()
    for name, value in here.items():
        before = saved.get(name)
        if before != value and not (name in _DECODING_IDS and before is None):
            raise AttnkitError(
                f"the config does not fit the checkpoint in {run_dir}: model.{name} is "
                f"{before!r} there but {value!r} here; resume with the same [model] "
                "settings or start a new train.out_dir"
            )


def average_weights(paths: Sequence[str | Path]) -> dict[str, Tensor]:
    """Element-wise mean of several safetensors files with the same tensors (in float64)."""
    if not paths:
        raise AttnkitError("checkpoint averaging needs at least one checkpoint")
    total: dict[str, Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for path in paths:
        tensors = merge_lora_tensors(load_file(str(path)))
        if total and tensors.keys() != total.keys():
            raise AttnkitError(f"{path} holds other tensors than {paths[0]}; it cannot be averaged")
        for name, t in tensors.items():
            dtypes[name] = t.dtype
            total[name] = total.get(name, 0) + t.double()
    return {name: (t / len(paths)).to(dtypes[name]) for name, t in total.items()}


def average_last(run_dir: str | Path, n: int) -> list[int]:
    """Write the mean of the last `n` step checkpoints as RUN_DIR/model.safetensors.

    Returns the steps averaged (fewer than `n` if fewer were saved).
    """
    folder = RunFolder(run_dir)
    steps = folder.saved_steps()[-n:]
    if not steps:
        raise AttnkitError(f"{folder.root} has no step checkpoints to average")
    mean = average_weights([folder.step_weights(s) for s in steps])
    atomic_write(folder.weights, lambda p: save_file(mean, str(p)))
    return steps
