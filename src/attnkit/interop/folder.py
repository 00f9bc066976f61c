"""A Hugging Face model folder, read and written with `json` and `safetensors` alone.

SRC_DIR/config.json                        model_type and hyper-parameters
SRC_DIR/model.safetensors                  the weights (or pytorch_model.bin,
    or shards listed in model.safetensors.index.json)
SRC_DIR/tokenizer.json                     the tokenizer, when there is one
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from attnkit.errors import AttnkitError
from attnkit.files import atomic_write
from attnkit.run import CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE

SHARD_INDEX = "model.safetensors.index.json"
TORCH_WEIGHTS = "pytorch_model.bin"


def is_hf_folder(path: str | Path) -> bool:
    """A folder whose config.json names a `model_type` (an attnkit run names a `shape`)."""
    config = Path(path) / CONFIG_FILE
    if not config.is_file():
        return False
    try:
        return "model_type" in json.loads(config.read_text())
    except json.JSONDecodeError:
        return False


def read_config(path: str | Path) -> dict[str, Any]:
    """config.json of a Hugging Face folder as a dict."""
    folder = Path(path)
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise AttnkitError(f"{folder} is not a Hugging Face model folder: it has no config.json")
    try:
        return json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise AttnkitError(f"{config_path} is not valid JSON: {err}") from None


def tokenizer_file(path: str | Path) -> Path | None:
    tokenizer = Path(path) / TOKENIZER_FILE
    return tokenizer if tokenizer.is_file() else None


def read_weights(path: str | Path) -> tuple[Path, dict[str, Tensor]]:
    """The weights file (or shard index) of a Hugging Face folder, and its tensors by name."""
    folder = Path(path)
    single, index, torch_file = folder / WEIGHTS_FILE, folder / SHARD_INDEX, folder / TORCH_WEIGHTS
    try:
        if single.is_file():
            return single, load_file(single)
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            tensors: dict[str, Tensor] = {}
            for shard in shards:
                tensors.update(load_file(folder / shard))
            return index, tensors
        if torch_file.is_file():
            # weights_only: a .bin is a pickle, and only tensors may come out of it.
            return torch_file, torch.load(torch_file, map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, RuntimeError, KeyError, json.JSONDecodeError) as err:
        raise AttnkitError(f"the weights in {folder} cannot be read: {err}") from None
    raise AttnkitError(
        f"{folder} has no weights: expected {WEIGHTS_FILE}, {SHARD_INDEX} or {TORCH_WEIGHTS}"
    )


def write_folder(path: str | Path, config: dict[str, Any], tensors: dict[str, Tensor]) -> Path:
    """Write config.json and model.safetensors (each atomically) into `path`."""
    folder = Path(path)
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    atomic_write(folder / CONFIG_FILE, lambda p: p.write_text(text))
    atomic_write(
        folder / WEIGHTS_FILE, lambda p: save_file(tensors, str(p), metadata={"format": "pt"})
    )
    return folder
