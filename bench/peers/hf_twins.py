"""Twin models: an attnkit model and a Hugging Face one with the same weights.

Used by the decoding benchmark (`python -m bench generate`) and its parity
tests (tests/generation/test_generate_hf.py) so both sides decode identical
tokens. The Hugging Face model is built from a small config with
random weights, saved, and read back by attnkit's own importer
(`attnkit.interop.load_hf`), so the weight mapping lives in one place.
"""

from __future__ import annotations

import tempfile

import torch
from transformers import (
    BloomConfig,
    BloomForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    MarianConfig,
    MarianMTModel,
    MistralConfig,
    MistralForCausalLM,
)

from attnkit.interop import load_hf
from attnkit.models import TransformerModel


def _attnkit_twin(hf: torch.nn.Module) -> TransformerModel:
    """The attnkit model of `hf`, through a Hugging Face folder, in eval mode."""
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        return load_hf(folder).model.eval()


def gpt2_twins(
    n_layers: int, d_model: int, n_heads: int, vocab_size: int, max_len: int, seed: int = 0
) -> tuple[TransformerModel, GPT2LMHeadModel]:
    """A random GPT-2 and the attnkit `DecoderOnly` with its weights, both in eval mode."""
    torch.manual_seed(seed)
    hf = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=vocab_size,
            n_positions=max_len,
            n_embd=d_model,
            n_layer=n_layers,
            n_head=n_heads,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
    ).eval()
    return _attnkit_twin(hf), hf


def mistral_twins(
    n_layers: int,
    d_model: int,
    n_heads: int,
    vocab_size: int,
    max_len: int,
    sliding_window: int,
    seed: int = 0,
) -> tuple[TransformerModel, MistralForCausalLM]:
    """A random Mistral (LLaMA with a sliding window; 2 key/value heads, tied embeddings)
    and the attnkit `DecoderOnly` with its weights, both in eval mode."""
    torch.manual_seed(seed)
    hf = MistralForCausalLM(
        MistralConfig(
            vocab_size=vocab_size,
            max_position_embeddings=max_len,
            hidden_size=d_model,
            intermediate_size=2 * d_model,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            num_key_value_heads=2,
            sliding_window=sliding_window,
            tie_word_embeddings=True,
            # With the default 0.02 the tied embedding dominates and every step repeats
            # the last token; larger weights make the decoding exercise attention.
            initializer_range=0.3,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
    ).eval()
    return _attnkit_twin(hf), hf


def bloom_twins(
    n_layers: int, d_model: int, n_heads: int, vocab_size: int, seed: int = 0
) -> tuple[TransformerModel, BloomForCausalLM]:
    """A random BLOOM (ALiBi, no position vectors) and the attnkit `DecoderOnly` with its
    weights, both in eval mode."""
    torch.manual_seed(seed)
    hf = BloomForCausalLM(
        BloomConfig(
            vocab_size=vocab_size,
            hidden_size=d_model,
            n_layer=n_layers,
            n_head=n_heads,
            initializer_range=0.3,  # as mistral_twins: so that decoding exercises attention
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
    ).eval()
    return _attnkit_twin(hf), hf


def marian_twins(
    n_layers: int, d_model: int, n_heads: int, vocab_size: int, max_len: int, seed: int = 0
) -> tuple[TransformerModel, MarianMTModel]:
    """A random Marian model and the attnkit `EncoderDecoder` with its weights, in eval mode.

    Marian starts the decoder with its pad id (0 here) and its default config
    forces EOS at the last step; that is switched off so plain decoding is compared.
    """
    torch.manual_seed(seed)
    hf = MarianMTModel(
        MarianConfig(
            vocab_size=vocab_size,
            d_model=d_model,
            encoder_layers=n_layers,
            decoder_layers=n_layers,
            encoder_attention_heads=n_heads,
            decoder_attention_heads=n_heads,
            encoder_ffn_dim=4 * d_model,
            decoder_ffn_dim=4 * d_model,
            max_position_embeddings=max_len,
            activation_function="relu",
            dropout=0.0,
            attention_dropout=0.0,
            activation_dropout=0.0,
            pad_token_id=0,
            eos_token_id=2,
            decoder_start_token_id=0,
            forced_eos_token_id=None,
            scale_embedding=True,
            share_encoder_decoder_embeddings=True,
        )
    ).eval()
    hf.generation_config.forced_eos_token_id = None
    hf.generation_config.bad_words_ids = None
    return _attnkit_twin(hf), hf
