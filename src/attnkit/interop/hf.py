"""Import and export of Hugging Face checkpoints, one family per model_type.

    load_hf(SRC_DIR)        config.json -> ModelConfig, tensors -> an attnkit model
    save_hf(model, OUT_DIR) the reverse: a folder that `transformers` loads

GPT-2, LLaMA, Mistral, Mixtral and BLOOM, BERT, and Marian become `DecoderOnly`,
`EncoderOnly` and `EncoderDecoder` built from a plain `ModelConfig`: every
difference between the families is a config field, and the same `Block` runs
them all.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.files import atomic_write
from attnkit.interop.bert import BERT
from attnkit.interop.bloom import BLOOM
from attnkit.interop.folder import (
    is_hf_folder,
    read_config,
    read_weights,
    tokenizer_file,
    write_folder,
)
from attnkit.interop.gpt2 import GPT2
from attnkit.interop.llama import LLAMA, MISTRAL, MIXTRAL
from attnkit.interop.mapping import Family, dump_tensors, load_tensors
from attnkit.interop.marian import MARIAN
from attnkit.models import TransformerModel, build_model
from attnkit.run import TOKENIZER_FILE, RunFolder, load_pretrained, save_pretrained

log = logging.getLogger(__name__)

FAMILIES: dict[str, Family] = {
    f.model_type: f for f in (GPT2, LLAMA, MISTRAL, MIXTRAL, BLOOM, BERT, MARIAN)
}


def family_for(model_type: str | None) -> Family:
    """The family of a config.json's `model_type`."""
    if model_type not in FAMILIES:
        raise AttnkitError(
            f"model_type {model_type!r} is not supported; the supported ones are "
            f"{', '.join(FAMILIES)}"
        )
    return FAMILIES[model_type]


def _family_for(config: ModelConfig) -> tuple[Family, dict[str, Any]]:
    """The first family of the model's shape that can express it, with its config.json.

    None can: the error of each family, which names the fields it has no place for.
    """
    errors = {}
    for family in FAMILIES.values():
        if family.shape == config.shape:
            try:
                return family, family.hf_config(config)
            except AttnkitError as err:
                errors[family.model_type] = err
    if len(errors) == 1:
        raise next(iter(errors.values()))
    raise AttnkitError(
        f"no {config.shape} family of transformers can hold this model: "
        + "; ".join(f"[{name}] {err}" for name, err in errors.items())
    )


@dataclass
class Imported:
    """An imported model, with what the checkpoint held that the model does not use."""

    model: TransformerModel
    model_type: str
    unused: list[str]
    tokenizer: Path | None


def load_hf(src_dir: str | Path, device: str | torch.device = "cpu") -> Imported:
    """Build the attnkit model of a Hugging Face folder, in eval mode.

    Tensors the model does not use (BERT's pooler, a masked-LM head) are
    listed in `Imported.unused` and logged as a warning.
    """
    hf_config = read_config(src_dir)
    family = family_for(hf_config.get("model_type"))
    model = build_model(family.config_from_hf(hf_config))
    weights, tensors = read_weights(src_dir)
    unused = load_tensors(model, family, tensors, str(weights))
    if unused:
        log.warning(
            "%d tensors of %s are not used by attnkit's %s model: %s",
            len(unused),
            weights,
            family.model_type,
            ", ".join(unused),
        )
    return Imported(model.to(device).eval(), family.model_type, unused, tokenizer_file(src_dir))


def save_hf(
    model: TransformerModel, out_dir: str | Path, tokenizer: str | Path | None = None
) -> Path:
    """Write `model` as a Hugging Face folder: config.json, model.safetensors, tokenizer.json.

    The family is the first of the shape's that can express the model (decoder:
    gpt2, llama, mistral, mixtral, bloom; encoder: bert; encoder-decoder: marian); a
    model none can express is refused, naming the fields.
    """
    model = getattr(model, "_orig_mod", model)
    family, config = _family_for(model.config)
    out = write_folder(out_dir, config, dump_tensors(model, family))
    if tokenizer is not None:
        _copy(Path(tokenizer), out / TOKENIZER_FILE)
    return out


def import_hf(src_dir: str | Path, run_dir: str | Path) -> Imported:
    """Turn a Hugging Face folder into an attnkit run folder (with its tokenizer.json)."""
    imported = load_hf(src_dir)
    save_pretrained(imported.model, run_dir)
    if imported.tokenizer is not None:
        _copy(imported.tokenizer, RunFolder(run_dir).tokenizer)
    return imported


def export_hf(run_dir: str | Path, out_dir: str | Path) -> Path:
    """Turn an attnkit run folder into a Hugging Face folder."""
    tokenizer = RunFolder(run_dir).tokenizer
    return save_hf(load_pretrained(run_dir), out_dir, tokenizer if tokenizer.is_file() else None)


def from_pretrained(path: str | Path, device: str | torch.device = "cpu") -> TransformerModel:
    """The model of an attnkit run folder or of a Hugging Face folder, in eval mode."""
    if is_hf_folder(path):
        return load_hf(path, device).model
    return load_pretrained(path, device)


def _copy(src: Path, dst: Path) -> None:
    atomic_write(dst, lambda p: shutil.copyfile(src, p))
