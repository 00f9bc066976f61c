"""Reading and writing the fields of a Hugging Face config.json.

Names differ between the families (n_embd, hidden_size, d_model) and are
mapped in each family's module; what they share is here: activation names,
special token ids, and refusing options that attnkit does not compute.
"""

from __future__ import annotations

import logging
from typing import Any

from attnkit.errors import AttnkitError

log = logging.getLogger(__name__)

# Hugging Face activation names -> attnkit's; the first name of each is written on export.
ACTIVATIONS_FROM_HF = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "swish": "silu",
    "silu": "silu",
}
ACTIVATIONS_TO_HF = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "swish"}


def require(hf: dict[str, Any], family: str, supported: dict[str, object]) -> None:
    """Refuse options that change the computation in a way attnkit does not.

    `supported` maps each option to the one value attnkit computes, which is
    also its default when config.json leaves it out.
    """
    for key, expected in supported.items():
        value = hf.get(key, expected)
        if value != expected:
            raise AttnkitError(
                f"{family} option {key}={value!r} is not supported by attnkit, which computes "
                f"{key}={expected!r}"
            )


def activation_to_hf(name: str) -> str:
    if name not in ACTIVATIONS_TO_HF:
        raise AttnkitError(
            f"activation {name!r} has no place in this family, whose feed-forward network is "
            f"not gated; it takes {', '.join(ACTIVATIONS_TO_HF)}"
        )
    return ACTIVATIONS_TO_HF[name]


def activation_from_hf(name: str) -> str:
    if name not in ACTIVATIONS_FROM_HF:
        raise AttnkitError(
            f"activation {name!r} is not supported; the supported ones are "
            f"{', '.join(ACTIVATIONS_FROM_HF)}"
        )
    return ACTIVATIONS_FROM_HF[name]


def special_id(hf: dict[str, Any], key: str, vocab_size: int) -> int | None:
    """A special token id from config.json; a list gives its first, an id out of range None."""
    value = hf.get(key)
    if isinstance(value, list):
        value = value[0] if value else None
    if value is None:
        return None
    if not 0 <= value < vocab_size:
        log.warning("ignored %s %s: it is outside the vocabulary of %d", key, value, vocab_size)
        return None
    return value
