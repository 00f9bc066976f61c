"""attnkit: a complete, correct and fast Transformer toolkit on PyTorch."""

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.interop import from_pretrained
from attnkit.models import DecoderOnly, EncoderDecoder, EncoderOnly, Output, build_model
from attnkit.presets import PRESETS
from attnkit.tokenizer import Tokenizer

__version__ = "0.1.0"

__all__ = [
    "PRESETS",
    "AttnkitError",
    "DecoderOnly",
    "EncoderDecoder",
    "EncoderOnly",
    "ModelConfig",
    "Output",
    "Tokenizer",
    "__version__",
    "build_model",
    "from_pretrained",
]
