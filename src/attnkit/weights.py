"""A model's weights in a safetensors file: read, checked and loaded.

A damaged file is refused in one sentence, apart from weights that do not fit the
model: a truncated file or a broken header fails to parse (`read_weights`), and a
NaN or an infinity in a tensor, which would load and then make decoding crash or
print nothing, is found in one pass over the weights (`check_finite`). A tied
matrix is stored once, so `load_weights` accepts its second name missing.
Run folders (`attnkit.run`), checkpoints and imported Hugging Face folders all
read their weights here.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel

log = logging.getLogger(__name__)


def load_weights(
    model: TransformerModel, weights_path: str | Path, device: str | torch.device = "cpu"
) -> TransformerModel:
    """Load a model.safetensors into `model` in place, refusing any mismatch in one sentence.

    A damaged file (truncated, a broken header, NaN or Inf in a tensor) is named
    as damaged (`read_weights`), apart from weights that do not fit the model.
    """
    tensors = read_weights(weights_path, device)
    _warn_of_integer_weights(model, tensors, weights_path)
    try:
        missing, unexpected = model.load_state_dict(tensors, strict=False)
    except RuntimeError as err:
        # torch lists every tensor, a line each: one sentence names how many and the first.
        lines = [line.strip() for line in str(err).splitlines() if "mismatch" in line]
        first = lines[0].rstrip(".") if lines else str(err).splitlines()[0]
        raise AttnkitError(
            f"the weights in {weights_path} do not fit the model of {model.config.shape!r} "
            f"shape and its config: {len(lines) or 1} tensors differ ({first}); "
            "was config.json edited after training? put back the one trained with"
        ) from None
    # Tied weights are stored once, so their second name is reported missing; that is fine.
    tied = {name for name in missing if _is_tied(model, name)}
    if set(missing) - tied or unexpected:
        raise AttnkitError(
            f"the weights in {weights_path} do not match the model's config: missing "
            f"{sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    return model


def _warn_of_integer_weights(
    model: TransformerModel, tensors: dict[str, Tensor], path: str | Path
) -> None:
    """Say that integer tensors were cast to the model's floats (float16 and bfloat16 are
    floats already, and fine): integer weights are rounded, or not weights at all."""
    own = model.state_dict()
    cast = [
        name
        for name, tensor in tensors.items()
        if name in own and own[name].is_floating_point() and not tensor.is_floating_point()
    ]
    if cast:
        log.warning(
            "%s: %d tensors are stored as integers (first: %r, %s) and were cast to %s; a "
            "model's weights are floats, so check what wrote the file",
            path,
            len(cast),
            cast[0],
            tensors[cast[0]].dtype,
            own[cast[0]].dtype,
        )


def read_weights(path: str | Path, device: str | torch.device = "cpu") -> dict[str, Tensor]:
    """The tensors of a safetensors file, refusing a damaged one in one sentence.

    A truncated file or a broken header fails to parse; NaN or Inf in a tensor
    would load, then make decoding crash or print nothing, so every floating
    tensor is checked (one pass over the weights).
    """
    path = Path(path)
    try:
        tensors = load_file(path, device=str(device))
    except (SafetensorError, OSError) as err:
        raise AttnkitError(
            f"{path.name} in {path.parent} is damaged ({err}): the file cannot be read; "
            "replace it with an intact copy"
        ) from None
    check_finite(tensors, path)
    return tensors


def check_finite(tensors: dict[str, Tensor], path: Path) -> None:
    """Refuse weights read from `path` with a NaN or an infinity, naming the first such tensor."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            what = "NaN" if bool(torch.isnan(tensor).any()) else "infinite"
            raise AttnkitError(
                f"{path.name} in {path.parent} is damaged: its tensor {name!r} holds {what} "
                "values; replace the file with an intact copy"
            )


def _is_tied(model: torch.nn.Module, name: str) -> bool:
    target = model.get_parameter(name)
    return any(p is target and n != name for n, p in model.named_parameters(remove_duplicate=False))
