"""A run folder: everything about one model in one place.

    RUN_DIR/config.json         the ModelConfig
    RUN_DIR/model.safetensors   the weights (a tied matrix stored once)
    RUN_DIR/tokenizer.json      the tokenizer, when there is one

Every command accepts such a folder. Files are written to a temporary name
and renamed, so a crash mid-write never leaves a half-written file behind.
A model with LoRA layers is saved merged, as the plain model its config describes.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel, build_model
from attnkit.nn.lora import merged_copy

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` on a temporary file beside `path`, then rename it to `path`.

    The rename is atomic on POSIX, so readers see the old file or the new one,
    never a partial one; if `write` raises, the old file is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def save_pretrained(model: TransformerModel, run_dir: str | Path) -> Path:
    """Write config.json and model.safetensors into `run_dir`."""
    run_dir = Path(run_dir)
    # torch.compile wraps the model; save what it wraps so no `_orig_mod.` prefix is stored.
    model = merged_copy(getattr(model, "_orig_mod", model))
    atomic_write(run_dir / CONFIG_FILE, lambda p: p.write_text(model.config.to_json()))
    atomic_write(run_dir / WEIGHTS_FILE, lambda p: save_model(model, str(p)))
    return run_dir


def load_pretrained(run_dir: str | Path, device: str | torch.device = "cpu") -> TransformerModel:
    """Rebuild the model of a run folder from its config and weights, in eval mode."""
    run_dir = Path(run_dir)
    config_path, weights_path = run_dir / CONFIG_FILE, run_dir / WEIGHTS_FILE
    for path in (config_path, weights_path):
        if not path.is_file():
            raise AttnkitError(
                f"{run_dir} is not an attnkit run folder: {path.name} is missing "
                "(train a model with `attnkit train` or import one with `attnkit import hf`)"
            )
    model = build_model(ModelConfig.from_json(config_path))
    load_weights(model, weights_path, device)
    return model.to(device).eval()


def load_weights(
    model: TransformerModel, weights_path: str | Path, device: str | torch.device = "cpu"
) -> TransformerModel:
    """Load a model.safetensors into `model` in place, refusing any mismatch in one sentence."""
    try:
        missing, unexpected = load_model(model, str(weights_path), strict=False, device=str(device))
    except (SafetensorError, RuntimeError, FileNotFoundError) as err:
        raise AttnkitError(
            f"the weights in {weights_path} do not fit the model of {model.config.shape!r} "
            f"shape and its config: {err}"
        ) from None
    # Tied weights are stored once, so their second name is reported missing; that is fine.
    tied = {name for name in missing if _is_tied(model, name)}
    if set(missing) - tied or unexpected:
        raise AttnkitError(
            f"the weights in {weights_path} do not match the model's config: missing "
            f"{sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    return model


def _is_tied(model: torch.nn.Module, name: str) -> bool:
    target = model.get_parameter(name)
    return any(p is target and n != name for n, p in model.named_parameters(remove_duplicate=False))
