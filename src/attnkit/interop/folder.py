"""A Hugging Face model folder, read and written with `json` and `safetensors` alone.

A model is named by its folder, or by its Hub id (ORG/NAME, as transformers'
`from_pretrained` takes it): `model_folder` finds the id's snapshot in the
`huggingface_hub` cache, downloading the files attnkit reads when the Hub can
be reached (not with HF_HUB_OFFLINE=1).

SRC_DIR/config.json                        model_type and hyper-parameters
SRC_DIR/model.safetensors                  the weights (or pytorch_model.bin,
    or shards listed in model.safetensors.index.json)
SRC_DIR/tokenizer.json                     the tokenizer, when there is one

Only the folder's own files are read: a tokenizer.json that links to a file
elsewhere, or a shard index naming a path outside the folder, is refused, so
that a folder from elsewhere cannot have attnkit copy or read any file it
points at. The links of the Hugging Face cache, from a snapshot to its blobs,
are the one exception. A pytorch_model.bin is a pickle, read with
`weights_only`: only a state dict of tensors may come out of it, and attnkit
never unpickles anything else.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from attnkit.errors import AttnkitError
from attnkit.files import atomic_write
from attnkit.run import CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE
from attnkit.weights import check_finite
from attnkit.weights import read_weights as read_safetensors

SHARD_INDEX = "model.safetensors.index.json"
TORCH_WEIGHTS = "pytorch_model.bin"

# What a Hub id's download fetches: the files this module, the tokenizer and the pooling of a
# sentence-transformers model read (`attnkit.interop.sentence_transformers`), and the weights as
# safetensors (one file or shards); pytorch_model.bin only for a model that has no safetensors.
HUB_FILES = [CONFIG_FILE, "model*.safetensors", SHARD_INDEX, TOKENIZER_FILE,
             "tokenizer_config.json", "modules.json", "sentence_bert_config.json",
             "*_Pooling/config.json"]  # fmt: skip
# A Hub id: NAME or ORG/NAME, as the Hub spells them (letters, digits, - _ .).
HUB_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")


def model_folder(source: str | Path) -> Path:
    """The folder of a model named by `source`: a folder on disk as it is, else a Hub id
    (ORG/NAME) as its snapshot in the huggingface_hub cache, fetched when missing.

    A name that is neither a folder nor a Hub id, an id the Hub does not know, and an id with
    no copy in the cache while offline are refused, each in one sentence.
    """
    path = Path(source)
    if path.exists():
        return path
    name = str(source)
    if not is_hub_id(name):
        raise AttnkitError(
            f"there is no folder {name}; give a Hugging Face model folder, or a model's Hub id "
            "such as openai-community/gpt2"
        )
    return _hub_snapshot(name)


def is_hub_id(name: str) -> bool:
    """Whether `name` is shaped like a Hub id (NAME or ORG/NAME), not a relative path such as
    ./model or ../models/x (the Hub refuses names starting with . or holding .. or --)."""
    return bool(HUB_ID.fullmatch(name)) and not (
        name.startswith(".") or ".." in name or "--" in name
    )


def _hub_snapshot(repo_id: str) -> Path:
    """The cached snapshot of `repo_id` holding HUB_FILES, downloaded where they are missing."""
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.utils import HFValidationError, RepositoryNotFoundError
    except ImportError:
        raise AttnkitError(
            f"there is no folder {repo_id}, and reading it as a Hugging Face Hub id needs the "
            "huggingface_hub package: pip install huggingface_hub, or give the model's folder"
        ) from None
    offline = constants.HF_HUB_OFFLINE
    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
        if not any(folder.glob("model*.safetensors")):
            folder = Path(snapshot_download(repo_id, allow_patterns=[TORCH_WEIGHTS]))
    except (HFValidationError, RepositoryNotFoundError):  # a gated model's error is one too
        raise AttnkitError(
            f"{repo_id} is neither a folder here nor a model on the Hugging Face Hub (or one "
            "you may not read: log in with `hf auth login`); give a model folder or a Hub id "
            "such as openai-community/gpt2"
        ) from None
    except OSError as err:  # not in the cache, and no download: offline, or no connection
        why = (
            "HF_HUB_OFFLINE=1 forbids a download"
            if offline
            else f"the Hub could not be reached ({type(err).__name__})"
        )
        raise AttnkitError(
            f"{repo_id} is not a folder here, the Hugging Face Hub cache "
            f"({constants.HF_HUB_CACHE}) has no copy of it, and {why}: download it where there "
            "is network, with HF_HUB_OFFLINE unset, or give the model's own folder, as in "
            "attnkit import hf PATH/TO/MODEL RUN_DIR"
        ) from None
    return folder


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
    """config.json of a Hugging Face folder as a dict; an attnkit run folder is refused."""
    folder = Path(path)
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise AttnkitError(f"{folder} is not a Hugging Face model folder: it has no config.json")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise AttnkitError(f"{config_path} is not valid JSON: {err}") from None
    if not isinstance(config, dict):
        raise AttnkitError(
            f"{config_path} holds a JSON {type(config).__name__}, not an object of settings; "
            "fix config.json"
        )
    if "shape" in config and "model_type" not in config:
        raise AttnkitError(
            f"{folder} is already an attnkit run folder (its config.json names a shape, not a "
            "model_type); use it as it is, or export it with `attnkit export hf`"
        )
    return config


def tokenizer_file(path: str | Path) -> Path | None:
    """The folder's tokenizer.json, if it has one; a link to a file outside it is refused."""
    tokenizer = Path(path) / TOKENIZER_FILE
    return inside(Path(path), tokenizer, str(tokenizer)) if tokenizer.is_file() else None


def inside(folder: Path, path: Path, what: str) -> Path:
    """`path` (`what` names it for the user), refused when it leads outside `folder`: by
    `..`, an absolute name or a link.

    A link from a Hugging Face cache snapshot (`.../snapshots/REV/`) into the
    cache's `blobs/` stays inside: that is how the cache stores every file.
    """
    real, root = path.resolve(), folder.resolve()
    snapshots = next((p for p in (root, *root.parents) if p.parent.name == "snapshots"), None)
    if real.is_relative_to(root) or (
        snapshots is not None and real.is_relative_to(snapshots.parent.parent / "blobs")
    ):
        return path
    raise AttnkitError(
        f"{what} leads outside {folder} (to {real}); attnkit reads only the folder's own "
        "files: copy the file into the folder"
    )


def read_weights(path: str | Path) -> tuple[Path, dict[str, Tensor]]:
    """The weights file (or shard index) of a Hugging Face folder, and its tensors by name.

    A damaged file, or a tensor holding NaN or Inf, is refused (`attnkit.weights.read_weights`).
    """
    folder = Path(path)
    single, index, torch_file = folder / WEIGHTS_FILE, folder / SHARD_INDEX, folder / TORCH_WEIGHTS
    if single.is_file():
        return single, read_safetensors(single)
    if index.is_file():
        return index, _read_shards(folder, index)
    if torch_file.is_file():
        tensors = _read_torch_weights(torch_file)
        check_finite(tensors, torch_file)
        return torch_file, tensors
    raise AttnkitError(
        f"{folder} has no weights: expected {WEIGHTS_FILE}, {SHARD_INDEX} or {TORCH_WEIGHTS}"
    )


def _read_shards(folder: Path, index: Path) -> dict[str, Tensor]:
    """The tensors of every shard that the index names, each a file inside `folder`."""
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
        raise AttnkitError(
            f"{index} is not a shard index, a JSON object whose weight_map maps tensor names to "
            f"files ({type(err).__name__}: {err})"
        ) from None
    tensors: dict[str, Tensor] = {}
    for shard in shards:
        what = f"the shard {shard!r} named in {index}"
        if not isinstance(shard, str):
            raise AttnkitError(f"{what} is not a file name; give each tensor a file name")
        path = inside(folder, folder / shard, what)
        if not path.is_file():
            raise AttnkitError(f"{what} is missing; download it into {folder}")
        tensors.update(read_safetensors(path))
    return tensors


def _read_torch_weights(path: Path) -> dict[str, Tensor]:
    """The state dict in a pytorch_model.bin, read with `weights_only` (no code runs)."""
    where = f"{path.name} in {path.parent}"
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        if found is None:
            raise AttnkitError(
                f"{where} is damaged or not a PyTorch weights file: it cannot be unpickled"
            ) from None
        raise AttnkitError(
            f"{where} holds Python objects ({found.group(1)}) besides tensors, which attnkit "
            "will not unpickle because unpickling can run code; save the model's state dict "
            "alone, or its weights as model.safetensors"
        ) from None
    except Exception:
        # Torch's own words may advise weights_only=False (which runs the file's code), and a
        # truncated file fails in many ways (EOFError, IndexError, struct.error): one sentence.
        raise AttnkitError(
            f"{where} is damaged or not a PyTorch weights file; download it again"
        ) from None
    wrong = _not_a_state_dict(loaded)
    if wrong:
        raise AttnkitError(
            f"{where} holds {wrong}, not a state dict of tensor names to tensors; save "
            "model.state_dict() there"
        )
    return loaded


def _not_a_state_dict(loaded: object) -> str | None:
    """What `loaded` is, when it is not a dict of names to tensors."""
    if not isinstance(loaded, dict):
        return f"a {type(loaded).__name__}"
    for key, value in loaded.items():
        if not isinstance(key, str) or not isinstance(value, Tensor):
            return f"a dict whose entry {key!r} is a {type(value).__name__}"
    return None


def write_folder(path: str | Path, config: dict[str, Any], tensors: dict[str, Tensor]) -> Path:
    """Write config.json and model.safetensors (each atomically) into `path`."""
    folder = Path(path)
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    atomic_write(folder / CONFIG_FILE, lambda p: p.write_text(text))
    atomic_write(
        folder / WEIGHTS_FILE, lambda p: save_file(tensors, str(p), metadata={"format": "pt"})
    )
    return folder
