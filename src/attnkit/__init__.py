"""attnkit: a complete, correct and fast Transformer toolkit on PyTorch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Each public name and the module it lives in, imported on first use (PEP 562): `import
# attnkit` itself loads no torch, so the command line takes its arguments, and a Ctrl-C,
# before the heavy imports start.
_WHERE = {
    "PRESETS": "attnkit.presets",
    "AttnkitError": "attnkit.errors",
    "DecoderOnly": "attnkit.models",
    "EncoderDecoder": "attnkit.models",
    "EncoderOnly": "attnkit.models",
    "GenerationConfig": "attnkit.generation",
    "LLM": "attnkit.generation",
    "ModelConfig": "attnkit.config",
    "Output": "attnkit.models",
    "Tokenizer": "attnkit.tokenizer",
    "build_model": "attnkit.models",
    "from_pretrained": "attnkit.interop",
}

__all__ = [
    "LLM",
    "PRESETS",
    "AttnkitError",
    "DecoderOnly",
    "EncoderDecoder",
    "EncoderOnly",
    "GenerationConfig",
    "ModelConfig",
    "Output",
    "Tokenizer",
    "__version__",
    "build_model",
    "from_pretrained",
]

if TYPE_CHECKING:
    from attnkit.config import ModelConfig
    from attnkit.errors import AttnkitError
    from attnkit.generation import LLM, GenerationConfig
    from attnkit.interop import from_pretrained
    from attnkit.models import DecoderOnly, EncoderDecoder, EncoderOnly, Output, build_model
    from attnkit.presets import PRESETS
    from attnkit.tokenizer import Tokenizer


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'attnkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value  # found once, then an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
