"""Import and export of Hugging Face checkpoints, one family per model_type.

    load_hf(SRC_DIR)        config.json -> ModelConfig, tensors -> an attnkit model
    save_hf(model, OUT_DIR) the reverse: a folder that `transformers` loads

`import_hf` and `export_hf` turn one folder into the other. Neither writes
into a folder that is not empty unless asked to replace it (`overwrite`), and
then only one that holds a model; the new folder is complete before anything
of the old one goes.

GPT-2, LLaMA, Mistral, Mixtral and BLOOM, BERT, and Marian and T5 become `DecoderOnly`,
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
from attnkit.devices import check_device
from attnkit.errors import AttnkitError
from attnkit.files import atomic_write, replace_folder
from attnkit.interop.bert import BERT
from attnkit.interop.bloom import BLOOM
from attnkit.interop.folder import (
    inside,
    is_hf_folder,
    model_folder,
    read_config,
    read_weights,
    tokenizer_file,
    write_folder,
)
from attnkit.interop.gpt2 import GPT2
from attnkit.interop.hfconfig import check_tokenizer_fits
from attnkit.interop.llama import LLAMA, MISTRAL, MIXTRAL
from attnkit.interop.mapping import Family, dump_tensors, load_tensors
from attnkit.interop.marian import MARIAN
from attnkit.interop.sentence_transformers import read_pooling
from attnkit.interop.t5 import T5
from attnkit.models import TransformerModel, build_model
from attnkit.run import (
    CONFIG_FILE,
    TOKENIZER_FILE,
    RunFolder,
    load_pretrained,
    save_pretrained,
)
from attnkit.tokenizer import Tokenizer

log = logging.getLogger(__name__)

FAMILIES: dict[str, Family] = {
    f.model_type: f for f in (GPT2, LLAMA, MISTRAL, MIXTRAL, BLOOM, BERT, MARIAN, T5)
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
    if config.copy_attention != "none":
        raise AttnkitError(
            "this model has a pointer-generator output (copy_attention), which no family of "
            "transformers has; keep it as an attnkit run folder"
        )
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

    def report(self, run_dir: str | Path) -> str:
        """What the import made, in lines for a person: the model, the tokenizer, the unused."""
        lines = [
            f"imported {self.model_type} as an attnkit {self.model.config.shape} model "
            f"({self.model.num_parameters():,} parameters) into {run_dir}"
        ]
        if self.tokenizer is not None:
            lines.append(f"copied {self.tokenizer.name}")
        if self.unused:
            lines.append(
                f"not used by attnkit ({len(self.unused)} tensors): {', '.join(self.unused)}"
            )
        return "\n".join(lines)


def load_hf(src_dir: str | Path, device: str | torch.device = "cpu") -> Imported:
    """Build the attnkit model of a Hugging Face folder (or Hub id, `model_folder`), in eval mode.

    Tensors the model does not use (BERT's pooler, a masked-LM head) are
    listed in `Imported.unused` and logged as a warning.
    """
    device = check_device(device)
    src_dir = model_folder(src_dir)
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
    model: TransformerModel,
    out_dir: str | Path,
    tokenizer: str | Path | None = None,
    *,
    overwrite: bool = False,
) -> Path:
    """Write `model` as a Hugging Face folder: config.json, model.safetensors, tokenizer.json.

    The family is the first of the shape's that can express the model (decoder:
    gpt2, llama, mistral, mixtral, bloom; encoder: bert; encoder-decoder: marian, t5); a
    model none can express is refused, naming the fields. A folder that is not
    empty is refused unless `overwrite` (`new_folder`).
    """
    return _write_hf(model, new_folder(out_dir, overwrite), tokenizer)


def import_hf(src_dir: str | Path, run_dir: str | Path, *, overwrite: bool = False) -> Imported:
    """Turn a Hugging Face folder into an attnkit run folder (with its tokenizer.json).

    `src_dir` is a folder, or a Hub id such as openai-community/gpt2, read from the
    huggingface_hub cache and downloaded into it when missing (`model_folder`).

    The run folder's weights carry the tokenizer's fingerprint, which loading checks; it
    keeps tokenizer_config.json (its chat template) and, from a sentence-transformers
    folder, the pooling of its sentence vectors. A folder that is not empty is
    refused unless `overwrite` (`new_folder`).
    """
    src_dir = model_folder(src_dir)
    target = new_folder(run_dir, overwrite, source=src_dir)
    imported = load_hf(src_dir)
    if imported.tokenizer is not None:  # another model's would be copied in, then misread
        check_tokenizer_fits(imported.model.config, imported.tokenizer)
    pooling = read_pooling(src_dir)
    settings = Path(src_dir) / "tokenizer_config.json"
    settings = inside(Path(src_dir), settings, str(settings)) if settings.is_file() else None

    def write(stage: Path) -> None:
        folder = RunFolder(stage)
        if imported.tokenizer is not None:  # recorded first, so the weights carry it
            _copy(imported.tokenizer, folder.tokenizer)
            _record_vocabulary(folder, imported.tokenizer)
        save_pretrained(imported.model, stage)
        if settings is not None:
            _copy(settings, folder.tokenizer_config)
        if pooling is not None:
            folder.write_pooling(pooling)

    replace_folder(target, write)
    return imported


def export_hf(run_dir: str | Path, out_dir: str | Path, *, overwrite: bool = False) -> Path:
    """Turn an attnkit run folder into a Hugging Face folder (refused where `new_folder` says)."""
    target = new_folder(out_dir, overwrite, source=run_dir)
    return _write_hf(load_pretrained(run_dir), target, tokenizer_file(run_dir))


def new_folder(path: str | Path, overwrite: bool, *, source: str | Path | None = None) -> Path:
    """`path` as a folder to write a model into, refused where writing would destroy work.

    A folder that is not empty is refused, unless `overwrite`, and even then
    when it holds no model (no config.json) or any entry attnkit does not write
    there (`RunFolder.owns`: a `.git`, a README.md, another model's files): attnkit
    replaces a model folder it may have made, never deletes or mixes in other files,
    so a re-import over an earlier import or run is clean. A folder holding
    `source`, the folder the model is read from, is refused too.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise AttnkitError(f"{path} is a file; give a folder to write the model into")
    if source is not None and Path(source).resolve().is_relative_to(path.resolve()):
        raise AttnkitError(
            f"{path} holds {source}, the folder the model is read from; write it elsewhere"
        )
    if path.is_dir() and any(path.iterdir()):
        if not overwrite:
            raise AttnkitError(
                f"{path} is not empty; choose a new folder, or pass --overwrite "
                "(overwrite=True) to replace what it holds"
            )
        foreign = sorted(e.name for e in path.iterdir() if not RunFolder(path).owns(e))
        if foreign:
            raise AttnkitError(
                f"{path} holds {', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}, "
                "which attnkit did not write, so it will not replace that folder, even with "
                "--overwrite; move them away or choose another folder"
            )
        if not (path / CONFIG_FILE).is_file():
            raise AttnkitError(
                f"{path} holds files but no model ({CONFIG_FILE}), so attnkit will not replace "
                "them, even with --overwrite; choose another folder"
            )
    return path


def from_pretrained(path: str | Path, device: str | torch.device = "cpu") -> TransformerModel:
    """The model of an attnkit run folder or of a Hugging Face folder, in eval mode."""
    if is_hf_folder(path):
        return load_hf(path, device).model
    return load_pretrained(path, device)


def _write_hf(model: TransformerModel, target: Path, tokenizer: str | Path | None) -> Path:
    """Fill `target` with the Hugging Face folder of `model` (`replace_folder`)."""
    model = getattr(model, "_orig_mod", model)
    family, config = _family_for(model.config)
    tensors = dump_tensors(model, family)

    def write(stage: Path) -> None:
        write_folder(stage, config, tensors)
        if tokenizer is not None:
            _copy(Path(tokenizer), stage / TOKENIZER_FILE)

    return replace_folder(target, write)


def _record_vocabulary(folder: RunFolder, tokenizer: Path) -> None:
    """Record the fingerprint of an imported tokenizer; one attnkit cannot read is only copied."""
    try:
        folder.record_tokenizer(Tokenizer.load(tokenizer))
    except AttnkitError as err:
        log.warning("%s; copied it as it is, with no fingerprint to check it by", err)


def _copy(src: Path, dst: Path) -> None:
    atomic_write(dst, lambda p: shutil.copyfile(src, p))
