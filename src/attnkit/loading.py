"""Train short, test long: what a trained model may change as it loads, and the check of it.

A model's weights fix its widths, heads and vocabulary, and learned positions
fix its length; its `max_len`, RoPE's theta and scalings, the attention window
and the interpolation of sinusoidal positions are not in the weights, so a run
trained on short text can be read back with them changed and evaluated on longer
text (`load_pretrained`'s `overrides`, `--set model.KEY=VALUE` on translate,
generate and eval).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError

log = logging.getLogger(__name__)

# What a loaded model may change without other weights: its length and how positions reach it.
LOADING_OVERRIDES = (
    "max_len", "rope_theta", "rope_scaling", "rope_scaling_type", "rope_original_max_len",
    "attention_window", "attention_backend", "positional_interpolation",
)  # fmt: skip


def overridden(config: ModelConfig, overrides: dict[str, Any], root: Path) -> ModelConfig:
    """The config with `overrides`, refusing a change the weights cannot follow."""
    if not overrides:
        return config
    wrong = sorted(set(overrides) - set(LOADING_OVERRIDES))
    if wrong:
        raise AttnkitError(
            f"model.{wrong[0]} cannot change once a model is trained; a loaded model may change "
            f"{', '.join('model.' + k for k in LOADING_OVERRIDES)}"
        )
    if (
        overrides.get("max_len", config.max_len) != config.max_len
        and config.positional == "learned"
    ):
        raise AttnkitError(
            f"{root} learned a position table of {config.max_len} rows, which fixes its max_len; "
            "another length needs sinusoidal, RoPE, xPos or ALiBi positions"
        )
    if overrides.get("max_len", config.max_len) != config.max_len and config.attention_random:
        raise AttnkitError(
            f"{root} draws its random attention blocks over its max_len {config.max_len}; "
            "another max_len would draw others, so it keeps its own"
        )
    changed = dataclasses.replace(config, **overrides)
    log.info(
        "%s: %s", root,
        ", ".join(f"model.{k} {getattr(config, k)!r} -> {v!r}" for k, v in overrides.items()),
    )  # fmt: skip
    return changed
