"""Reading and writing the fields of a Hugging Face config.json.

Names differ between the families (n_embd, hidden_size, d_model) and are
mapped in each family's module; what they share is here: activation names,
special token ids, settings read with their type checked, refusing options that
attnkit does not compute, and whether a folder's tokenizer fits its model.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.tokenizer import Tokenizer

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


_KINDS = {int: "a whole number", float: "a number", str: "a name in quotes"}


def setting(hf: dict[str, Any], key: str, default: Any, kind: type = int) -> Any:
    """config.json's `key` (`default` where it is left out or null), refused in one sentence
    where it is not of `kind` (`"num_heads": "4"`); a float setting takes an int too."""
    value = hf.get(key)
    value = default if value is None else value
    if kind is float:
        fits = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        fits = isinstance(value, kind) and not isinstance(value, bool)
    if not fits:
        raise AttnkitError(
            f"config.json's {key} is {value!r}, which should be {_KINDS[kind]}; fix config.json"
        )
    return value


def check_tokenizer_fits(config: ModelConfig, path: Path) -> None:
    """Refuse a folder's tokenizer (`path`) that is not its model's: one with ids past the
    model's vocabulary, or without the ids its config names (an EOS it could never write).
    One attnkit cannot read is left to the import, which copies it as it is."""
    try:
        size = Tokenizer.load(path, pretokenizer=False).vocab_size
    except AttnkitError:
        return
    if size > config.vocab_size:
        raise AttnkitError(
            f"{path} has {size:,} tokens, more than the {config.vocab_size:,} the model embeds; "
            "it is not this model's tokenizer: put the model's own beside it"
        )
    named = {
        "pad_token_id": config.pad_id,
        "eos_token_id": config.eos_id,
        "decoder_start_token_id": config.decoder_start_id,
    }
    past = {key: i for key, i in named.items() if i is not None and i >= size}
    if past:
        key, i = next(iter(past.items()))
        raise AttnkitError(
            f"{path} has {size:,} token{'s' * (size != 1)}, but the model's config.json names "
            f"{key} {i} (of a "
            f"vocabulary of {config.vocab_size:,}); it is not this model's tokenizer: put the "
            "model's own beside it"
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
    if not isinstance(value, int) or isinstance(value, bool):
        raise AttnkitError(
            f"config.json's {key} is {value!r}, which should be a token id; fix config.json"
        )
    if not 0 <= value < vocab_size:
        log.warning("ignored %s %s: it is outside the vocabulary of %d", key, value, vocab_size)
        return None
    return value
