"""The three Transformer shapes, each a stack of `Block`s with embeddings and a head."""

from attnkit.checks import of_type
from attnkit.config import ModelConfig
from attnkit.models.base import Output, TransformerModel
from attnkit.models.block import Block
from attnkit.models.decoder_only import DecoderOnly
from attnkit.models.encoder_decoder import EncoderDecoder
from attnkit.models.encoder_only import EncoderOnly

MODEL_CLASSES: dict[str, type[TransformerModel]] = {
    "encoder-decoder": EncoderDecoder,
    "decoder": DecoderOnly,
    "encoder": EncoderOnly,
}


def build_model(config: ModelConfig) -> TransformerModel:
    """The model of the shape the config names, freshly initialised."""
    of_type("config", config, ModelConfig, "make one with ModelConfig.from_dict(...)")
    return MODEL_CLASSES[config.shape](config)


__all__ = [
    "MODEL_CLASSES",
    "Block",
    "DecoderOnly",
    "EncoderDecoder",
    "EncoderOnly",
    "Output",
    "TransformerModel",
    "build_model",
]
