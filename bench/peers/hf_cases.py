"""Tiny Hugging Face models with random weights, and how to run them beside attnkit's.

The parity tests (tests/interop/) and `python -m bench parity` both use them.
Every parameter gets random noise (none is left at HF's initial ones and
zeros), so a bias or a norm mapped to the wrong place shows in the outputs.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor
from transformers import (
    BertConfig,
    BertModel,
    BloomConfig,
    BloomForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MarianConfig,
    MarianMTModel,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
)

from attnkit.data.batch import pad
from attnkit.models import TransformerModel

VOCAB = 61
TINY = {"n_layers": 2, "d_model": 32, "n_heads": 4, "d_ff": 64, "max_len": 32}


def tiny(cls: type[PretrainedConfig], names: dict[str, str], **extra) -> PretrainedConfig:
    """A config of `cls` with the TINY sizes under that family's names for them."""
    sizes = {theirs: TINY[ours] for theirs, ours in names.items()}
    return cls(**{"vocab_size": VOCAB, **sizes, **extra})


GPT2_NAMES = {"n_embd": "d_model", "n_layer": "n_layers", "n_head": "n_heads", "n_inner": "d_ff"}
BERT_NAMES = {
    "hidden_size": "d_model",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "intermediate_size": "d_ff",
    "max_position_embeddings": "max_len",
}
LLAMA_NAMES = {
    "hidden_size": "d_model",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "intermediate_size": "d_ff",
    "max_position_embeddings": "max_len",
}
MARIAN_NAMES = {
    "d_model": "d_model",
    "max_position_embeddings": "max_len",
    **{f"{side}_layers": "n_layers" for side in ("encoder", "decoder")},
    **{f"{side}_attention_heads": "n_heads" for side in ("encoder", "decoder")},
    **{f"{side}_ffn_dim": "d_ff" for side in ("encoder", "decoder")},
}


def _gpt2(**extra) -> GPT2Config:
    ids = {"bos_token_id": VOCAB - 1, "eos_token_id": VOCAB - 1}
    return tiny(GPT2Config, GPT2_NAMES, n_positions=TINY["max_len"], **ids, **extra)


def llama_config(
    cls: type[PretrainedConfig] = LlamaConfig, rope_type: str = "default", **extra
) -> PretrainedConfig:
    """Grouped-query attention (2 key/value heads for 4) and a RoPE base of its own.

    A stretched RoPE (`rope_type` linear or llama3) is stretched 8 times; llama3's
    trained length of 32 puts the 4 pairs of a head of 8 in all three of its bands.
    """
    rope = {"rope_type": rope_type, "rope_theta": 500.0}
    if rope_type != "default":
        rope["factor"] = 8.0
    if rope_type == "llama3":
        rope |= {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
        rope["original_max_position_embeddings"] = 32
    return tiny(cls, LLAMA_NAMES, num_key_value_heads=2, rope_parameters=rope, **extra)


def marian_config(**extra) -> MarianConfig:
    options = {
        "activation_function": "swish",
        "scale_embedding": True,
        "pad_token_id": 50,
        "decoder_start_token_id": 50,
        "eos_token_id": 0,
    }
    return tiny(MarianConfig, MARIAN_NAMES, **{**options, **extra})


# Each family, and the variants that take another path through its mapping.
CASES = {
    "gpt2": (GPT2LMHeadModel, _gpt2),
    "gpt2-untied": (
        GPT2LMHeadModel,
        lambda: _gpt2(tie_word_embeddings=False, activation_function="gelu"),
    ),
    "llama": (LlamaForCausalLM, llama_config),
    "llama-tied-biased": (
        LlamaForCausalLM,
        lambda: llama_config(tie_word_embeddings=True, attention_bias=True, mlp_bias=True),
    ),
    "llama-linear-rope": (LlamaForCausalLM, lambda: llama_config(rope_type="linear")),
    "llama3-rope": (LlamaForCausalLM, lambda: llama_config(rope_type="llama3")),
    # A window shorter than the test sequences, so that it masks something.
    "mistral": (MistralForCausalLM, lambda: llama_config(MistralConfig, sliding_window=3)),
    "mixtral": (
        MixtralForCausalLM,
        lambda: llama_config(MixtralConfig, num_local_experts=4, num_experts_per_tok=2),
    ),
    # Six heads: ALiBi's slopes for a number of heads that is not a power of two.
    "bloom": (
        BloomForCausalLM,
        lambda: BloomConfig(vocab_size=VOCAB, hidden_size=36, n_layer=2, n_head=6, seq_length=32),
    ),
    "bert": (BertModel, lambda: tiny(BertConfig, BERT_NAMES)),
    "marian": (MarianMTModel, marian_config),
    "marian-separate": (
        MarianMTModel,
        lambda: marian_config(share_encoder_decoder_embeddings=False, decoder_vocab_size=53),
    ),
}


def randomize(model: PreTrainedModel, seed: int, scale: float = 0.2) -> PreTrainedModel:
    """Add noise to every weight (and Marian's logits bias), keeping sinusoidal tables.

    Noise on top of the initial values keeps norm weights near 1, so the
    signal survives the layers and a misplaced tensor cannot hide.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if tensor.is_floating_point() and "embed_positions" not in name:
                tensor.add_(torch.randn(tensor.shape, generator=generator) * scale)
    return model


def save_random(
    case: str, path: Path, seed: int = 0, scale: float = 0.2, **changes
) -> PreTrainedModel:
    """Save a random model of `case` (config fields `changes`) to `path`.

    Returns it reloaded in eval mode with eager attention.
    """
    cls, make_config = CASES[case]
    config = make_config()
    for name, value in changes.items():
        setattr(config, name, value)
    torch.manual_seed(seed)
    randomize(cls(config), seed, scale).save_pretrained(path)
    return cls.from_pretrained(path, attn_implementation="eager").eval()


def padded_batch(model: TransformerModel, seed: int = 0) -> dict[str, Tensor]:
    """Right-padded sequences of different lengths, for either side of the model."""
    generator = torch.Generator().manual_seed(seed)
    c = model.config

    def sequences(lengths: list[int], vocab: int) -> tuple[Tensor, Tensor]:
        return pad(
            [torch.randint(1, vocab, (n,), generator=generator).tolist() for n in lengths], 0
        )

    ids, mask = sequences([7, 3, 5], c.src_vocab_size or c.vocab_size)
    batch = {"ids": ids, "mask": mask}
    if c.shape == "encoder-decoder":
        batch["tgt"], batch["tgt_mask"] = sequences([4, 6, 2], c.vocab_size)
    if c.n_token_types:
        batch["token_types"] = torch.randint(0, c.n_token_types, ids.shape, generator=generator)
    return batch


@torch.no_grad()
def run_attnkit(model: TransformerModel, b: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """The output to compare (logits, or BERT's hidden states) and the mask of real positions."""
    if model.config.shape == "encoder-decoder":
        return model(b["ids"], b["tgt"], b["mask"], b["tgt_mask"]).logits, b["tgt_mask"]
    if model.config.shape == "encoder":
        return model(b["ids"], b["mask"], token_types=b.get("token_types")).hidden, b["mask"]
    return model(b["ids"], b["mask"]).logits, b["mask"]


@torch.no_grad()
def run_hf(model: PreTrainedModel, b: dict[str, Tensor]) -> Tensor:
    inputs = {"input_ids": b["ids"], "attention_mask": b["mask"].long()}
    if "tgt" in b:
        inputs |= {"decoder_input_ids": b["tgt"], "decoder_attention_mask": b["tgt_mask"].long()}
    if "token_types" in b:
        inputs["token_type_ids"] = b["token_types"]
    out = model(**inputs)
    return out.last_hidden_state if isinstance(model, BertModel) else out.logits
