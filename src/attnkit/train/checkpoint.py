"""Checkpoints: a run folder that survives crashes and resumes exactly.

    RUN_DIR/config.json, model.safetensors   the model to use (latest, or the final average)
    RUN_DIR/trainer_state.pt                 optimizer, scheduler, scaler, step, RNG
                                             states, data position, best metric
    RUN_DIR/checkpoints/step-0000500/        the weights at each saved step (last K kept)
    RUN_DIR/checkpoints/best/                the weights with the best validation metric
    RUN_DIR/checkpoints/step-0000500/sharded/  under FSDP, the weights and the optimizer's
                                             state in slices, one file per rank
                                             (`attnkit.train.distributed_checkpoint`)

The paths are `attnkit.run.RunFolder`'s, and each function is handed the folder it works
in; what goes in the files is decided here.

Resuming continues the saved state of the optimizer, scheduler and scaler
(Adam's moments, the step count) under the settings it is given: a changed
learning rate, `min_lr`, weight decay, betas, `eps` or schedule (`schedule`,
`warmup`, `steps`, `decay_over`) applies from the next step, as every other
changed setting does, and the changes are logged in one line (the trainer
state records the settings that saved it). With no change, nothing is
touched and the run continues bit for bit. Refused is only what a resumed run
cannot follow: `train.seed` (the random state continues from the checkpoint),
`train.init_from` (the weights do) and another model config, with one
allowance: the decoding ids (`eos_id`, `decoder_start_id`) only tell
`generate` where to start and stop, and runs trained before models recorded
them saved None. A resume accepts that None and the run records the ids from
then on; a saved id that differs still refuses (it means another tokenizer).

A step checkpoint keeps LoRA factors apart (`attnkit.nn.lora`), so training
resumes with them; every other weights file holds the merged, plain model.

Every file is written to a temporary name and renamed (`attnkit.files.atomic_write`),
and the trainer state names the step whose weights it goes with, written only
after those weights and the latest model: a crash at any point leaves the
previous checkpoint whole, and a folder with a trainer state always loads.
Averaging the last N checkpoints (section 6.1: the base model averaged the
last 5) takes the element-wise mean of their (merged) weights.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file, save_model
from torch import Tensor

from attnkit.config import ModelConfig
from attnkit.cut_writes import library_partial, partial_of
from attnkit.errors import AttnkitError
from attnkit.files import WriteError, atomic_write
from attnkit.models import TransformerModel
from attnkit.nn.lora import merge_lora_tensors, merged_copy
from attnkit.run import SHARDS, WEIGHTS_FILE, RunFolder, save_pretrained
from attnkit.train.new_run import trained_files
from attnkit.train.run_config import EvalSection, TrainSection
from attnkit.weights import load_weights

log = logging.getLogger(__name__)

_DECODING_IDS = ("eos_id", "decoder_start_id")
# What a resumed run cannot follow: its random state and weights come from the checkpoint.
_FIXED = ("train.seed", "train.init_from")
# Where the run folder is: it may have moved since, and a resume takes it as it finds it.
_PLACE = ("train.out_dir",)


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
    folder: RunFolder, model: TransformerModel, state: dict[str, Any], keep_last: int
) -> Path:
    """Write the weights of `state["step"]`, then the latest model, then the trainer state.

    Older step checkpoints beyond the newest `keep_last` are removed last. A write
    that finds no room (disk full) stops with one sentence naming the checkpoint
    that is intact: the previous one until the trainer state names this step.
    """
    step = state["step"]
    saved = folder.saved_steps()
    intact = saved[-1] if saved else None  # the step the trainer state names until replaced
    try:
        metadata = folder.weights_metadata()
        atomic_write(
            folder.step_weights(step), lambda p: save_model(model, str(p), metadata=metadata)
        )
        save_pretrained(model, folder.root)
        atomic_write(folder.trainer_state, lambda p: torch.save(state, p))
        intact = step
    except WriteError as err:
        raise WriteError(err.path, err.reason, folder.intact(intact)) from None
    for old in folder.saved_steps()[:-keep_last]:
        if old != step:
            shutil.rmtree(folder.step_dir(old), ignore_errors=True)
    return folder.step_dir(step)


def remove_cut_writes(folder: RunFolder) -> int:
    """Remove the temporary files of writes that a crash cut short (kill -9 mid-save) from a
    run folder and its checkpoints; returns how many there were.

    Only a training holding the folder's lock calls this, so no write of theirs is under
    way; each can be as large as the model. Only a folder that is a run (it has a trainer
    state) is cleaned, and only the names `atomic_write` gives the files a training writes
    there, and the staging files safetensors leaves beside them: a user's own files, beside
    or below, are not attnkit's to remove.
    """
    if not folder.trainer_state.is_file():
        return 0
    # checkpoints/ is the training's own: its step and best folders hold weights alone.
    written = {folder.root: folder.files}
    # A step's folder also holds its sharded checkpoint, under FSDP, staged as a folder.
    steps = [d for d in folder.checkpoints.glob("*") if d.is_dir()]
    written |= {d: (d / WEIGHTS_FILE, d / SHARDS) for d in steps}
    cut = [
        path
        for place, files in written.items()
        for path in place.glob(".*")
        if library_partial(path)
        or (partial_of(path) in files and (path.is_file() or path.name.startswith(f".{SHARDS}.")))
    ]
    for path in cut:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return len(cut)


def save_best(folder: RunFolder, model: TransformerModel) -> Path:
    metadata = folder.weights_metadata()
    return atomic_write(
        folder.best_weights, lambda p: save_model(merged_copy(model), str(p), metadata=metadata)
    )


def load_trainer_state(folder: RunFolder) -> dict[str, Any]:
    """The trainer state of a run folder; weights_only loading, so it runs no pickled code."""
    path = folder.trainer_state
    if not path.is_file():
        if trained_files(folder):
            raise AttnkitError(
                f"{folder.root} has a trained model but no {path.name} to resume from, so it "
                "cannot continue; train a new model into another train.out_dir, or in its place "
                "with --overwrite"
            )
        raise AttnkitError(
            f"{folder.root} has no {path.name} to resume from; start a new run without --resume"
        )
    return folder.read_trainer_state()


def load_checkpoint(folder: RunFolder, model: TransformerModel) -> dict[str, Any]:
    """Load the weights of the latest saved step into `model`; return its trainer state."""
    state = load_trainer_state(folder)
    load_step(folder, model, state["step"])
    return state


def load_step(folder: RunFolder, model: TransformerModel, step: int) -> None:
    """Load the weights saved at `step` into `model`."""
    weights = folder.step_weights(step)
    if not weights.is_file():
        raise AttnkitError(
            f"{folder.root} has a trainer state for step {step} but no weights at {weights}; "
            "the run folder is incomplete"
        )
    load_weights(model, weights)


def resume(
    folder: RunFolder, model: TransformerModel, rank: int, world_size: int, weights: bool = True
) -> dict[str, Any]:
    """Load the latest checkpoint into `model` and this rank's RNG state; return the trainer state.

    Each rank continues from the RNG state the same rank saved, so a run resumed on as many
    processes continues bit for bit.
    """
    state = load_trainer_state(folder)
    _check_fits(state["model_config"], model.config, folder.root)
    if weights:  # a sharded model takes its weights from `distributed_checkpoint.restore`
        load_step(folder, model, state["step"])  # the state is read once: the largest file
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


def _check_fits(saved: dict[str, Any], config: ModelConfig, run_dir: Path) -> None:
    """Refuse to resume the checkpoint of a model config `saved` with `config`, naming the
    fields that differ."""
    differ = [
        f"model.{name} is {saved.get(name)!r} there but {value!r} here"
        for name, value in config.to_dict().items()
        if saved.get(name) != value and not (name in _DECODING_IDS and saved.get(name) is None)
    ]
    if differ:
        raise AttnkitError(
            f"the config does not fit the checkpoint in {run_dir}: {', '.join(differ)}; "
            "resume with the same [model] settings or start a new train.out_dir"
        )


def settings(train: TrainSection, eval: EvalSection) -> dict[str, Any]:
    """A session's settings by `section.key`, as the trainer state records them."""
    return {
        f"{name}.{key}": value
        for name, section in (("train", train), ("eval", eval))
        for key, value in dataclasses.asdict(section).items()
    }


def changed_settings(
    state: dict[str, Any], now: dict[str, Any], run_dir: Path
) -> dict[str, tuple[Any, Any]]:
    """The settings `now` that differ from those that saved `state`, as {key: (then, now)};
    a change that a resumed run cannot follow is refused, naming the keys."""
    then = state.get("settings") or _optimizer_settings(state)
    changes = {
        key: (value, now[key])
        for key, value in then.items()
        if key in now and key not in _PLACE and value != now[key]
    }
    fixed = [key for key in changes if key in _FIXED]
    if fixed:
        was = " and ".join(f"{key} = {changes[key][0]!r}" for key in fixed)
        raise AttnkitError(
            f"{' and '.join(fixed)} cannot change when a run resumes, since it continues from "
            f"the weights and random state of its checkpoint in {run_dir}; set {was} again "
            "or start a new train.out_dir"
        )
    return changes


def describe(changes: dict[str, tuple[Any, Any]]) -> str:
    """`changed_settings` in words: 'train.lr 0.001 -> 0.0005, train.warmup 100 -> 10'."""
    return ", ".join(f"{key} {then!r} -> {now!r}" for key, (then, now) in changes.items())


def _optimizer_settings(state: dict[str, Any]) -> dict[str, Any]:
    """The settings a trainer state saved before it recorded them still shows: its optimizer's."""
    group = state["optimizer"]["param_groups"][0]
    beta1, beta2 = group["betas"]
    return {
        "train.lr": state["scheduler"]["base_lrs"][0],
        "train.weight_decay": group["weight_decay"],
        "train.beta1": beta1,
        "train.beta2": beta2,
        "train.eps": group["eps"],
    }


def restore_optimization(
    state: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
    *,
    changed: bool,
    load_optimizer: Callable[[], None] | None = None,
) -> None:
    """Continue the saved optimizer, scheduler and scaler; when settings `changed`, under the
    hyperparameters that `optimizer` and `scheduler` were built with (this session's).

    Without a change the saved state is left exactly as it was, so the run goes on bit for
    bit. The schedule's shape is always this session's: a scheduler saves no function.
    `load_optimizer` loads the optimizer's saved state where it is not `state["optimizer"]`
    (a sharded checkpoint: `attnkit.train.distributed_checkpoint.restore`).
    """
    built = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    if load_optimizer is None:
        optimizer.load_state_dict(state["optimizer"])
    else:
        load_optimizer()
    scheduler.load_state_dict(state["scheduler"])
    if state["scaler"]:  # empty if it was off; a run that turns fp16 on starts a fresh one
        scaler.load_state_dict(state["scaler"])
    if not changed:
        return
    for group, hyperparameters in zip(optimizer.param_groups, built, strict=True):
        group.update(hyperparameters)
    scheduler.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
    # Back one step and forward again: the next step's rate, by the new base and schedule.
    scheduler.last_epoch -= 1
    scheduler.step()


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


def average_last(folder: RunFolder, n: int) -> list[int]:
    """Write the mean of the last `n` step checkpoints as RUN_DIR/model.safetensors.

    Returns the steps averaged (fewer than `n` if fewer were saved).
    """
    steps = folder.saved_steps()[-n:]
    if not steps:
        raise AttnkitError(f"{folder.root} has no step checkpoints to average")
    mean = average_weights([folder.step_weights(s) for s in steps])
    metadata = folder.weights_metadata()
    atomic_write(folder.weights, lambda p: save_file(mean, str(p), metadata=metadata))
    return steps
