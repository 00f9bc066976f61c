"""A sentence-transformers folder's pooling: how its sentence vectors are made from the encoder's.

    SRC_DIR/modules.json               the pipeline: Transformer, Pooling, Normalize, ...
    SRC_DIR/1_Pooling/config.json      the pooling modes (pooling_mode_mean_tokens: true, ...)
    SRC_DIR/sentence_bert_config.json  max_seq_length: where inputs are cut

read into an `attnkit.pooling.Pooling`, which an import keeps in the run folder,
so that `/v1/embeddings` and `SentenceEncoder` pool as sentence-transformers
does. A module attnkit does not run (a Dense projection, say) is named in a
warning: the vectors would differ.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from attnkit.errors import AttnkitError
from attnkit.interop.folder import inside
from attnkit.pooling import MODES, Pooling

log = logging.getLogger(__name__)

# The old config's flags, in the order sentence-transformers concatenates the modes.
_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_RUN_HERE = ("Transformer", "Pooling", "Normalize")


def read_pooling(folder: str | Path) -> Pooling | None:
    """The pooling a sentence-transformers folder describes, or None if it is not one."""
    folder = Path(folder)
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    modules = _json(folder, modules_file)
    if not isinstance(modules, list):
        raise AttnkitError(f"{modules_file} is not a list of modules; fix or remove it")
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
    others = sorted(k for k in kinds if k not in _RUN_HERE)
    if others:
        log.warning(
            "%s's sentence-transformers pipeline has %s, which attnkit does not run: its "
            "sentence vectors will differ from sentence-transformers'",
            folder,
            ", ".join(others),
        )
    if "Pooling" not in kinds:
        return None
    config = _json(folder, folder / str(kinds["Pooling"].get("path", "")) / "config.json")
    limit = None
    settings = folder / "sentence_bert_config.json"
    if settings.is_file():
        limit = _json(folder, settings).get("max_seq_length")
    return Pooling(_modes(config), normalize="Normalize" in kinds, max_tokens=limit)


def _modes(config: dict[str, Any]) -> tuple[str, ...]:
    mode = config.get("pooling_mode")
    if isinstance(mode, str):
        return (_mode_name(mode),)
    if isinstance(mode, list):
        return tuple(_mode_name(m) for m in mode)
    return tuple(name for flag, name in _FLAGS.items() if config.get(flag))


def _mode_name(mode: str) -> str:
    name = {"mean_tokens": "mean", "cls_token": "cls", "max_tokens": "max"}.get(mode, mode)
    if name not in MODES:
        raise AttnkitError(f"the pooling mode {mode!r} is not one attnkit knows ({MODES})")
    return name


def _json(folder: Path, path: Path) -> Any:
    path = inside(folder, path, str(path))
    if not path.is_file():
        raise AttnkitError(f"{path} is missing; the folder's modules.json names it")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise AttnkitError(f"{path} is not valid JSON: {err}") from None
