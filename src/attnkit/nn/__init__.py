"""Building blocks of the Transformer, each independent of the model shapes."""

from attnkit.nn.attention import AttentionInputs, AttentionPath, MultiHeadAttention
from attnkit.nn.embedding import TokenEmbedding
from attnkit.nn.feedforward import FeedForward
from attnkit.nn.linear import Linear
from attnkit.nn.lora import LoRALinear, apply_lora, lora_state_dict, merge_lora
from attnkit.nn.masks import causal_mask, padding_mask, self_attention_mask
from attnkit.nn.moe import MixtureOfExperts, load_balancing_loss, router_aux_loss
from attnkit.nn.norm import Residual, make_norm
from attnkit.nn.positional import AbsolutePositions, sinusoidal_table
from attnkit.nn.scaled_dot_product import scaled_dot_product_attention
from attnkit.nn.window import Window

__all__ = [
    "AbsolutePositions",
    "AttentionInputs",
    "AttentionPath",
    "FeedForward",
    "Linear",
    "LoRALinear",
    "MixtureOfExperts",
    "MultiHeadAttention",
    "Residual",
    "TokenEmbedding",
    "Window",
    "apply_lora",
    "causal_mask",
    "load_balancing_loss",
    "lora_state_dict",
    "make_norm",
    "merge_lora",
    "padding_mask",
    "router_aux_loss",
    "scaled_dot_product_attention",
    "self_attention_mask",
    "sinusoidal_table",
]
