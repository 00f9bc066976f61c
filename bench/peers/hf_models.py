"""Hugging Face reference models with random weights, and attnkit's model of each.

Two kinds, one config builder (`family_config`: attnkit's names for the sizes,
put under each family's) and one way into attnkit (`attnkit.interop.load_hf`
on the model's saved folder, so the weight mapping lives in one place):

- the parity cases (`CASES`, `save_random`): tiny models of every family and
  of the variants that take another path through its mapping, for the parity
  tests (tests/interop/) and `python -m bench parity`. Every parameter gets
  random noise (none is left at HF's initial ones and zeros), so a bias or a
  norm mapped to the wrong place shows in the outputs;
- the twins (`gpt2_twins`, ...): a model of the sizes the caller gives and
  the attnkit model with its weights, for the decoding benchmark
  (`python -m bench generate`) and its tests (tests/generation/), so that
  both sides decode identical tokens.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
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
    T5Config,
    T5ForConditionalGeneration,
)

from attnkit.data.batch import pad
from attnkit.interop import load_hf
from attnkit.models import TransformerModel

VOCAB = 61
TINY = {"vocab_size": VOCAB, "n_layers": 2, "d_model": 32, "n_heads": 4, "d_ff": 64, "max_len": 32}

# Each family's names for attnkit's sizes (vocab_size is the same in all).
GPT2_NAMES = {
    "n_embd": "d_model",
    "n_layer": "n_layers",
    "n_head": "n_heads",
    "n_inner": "d_ff",
    "n_positions": "max_len",
}
# BERT, LLaMA, Mistral and Mixtral.
HIDDEN_NAMES = {
    "hidden_size": "d_model",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "intermediate_size": "d_ff",
    "max_position_embeddings": "max_len",
}
BLOOM_NAMES = {
    "hidden_size": "d_model",
    "n_layer": "n_layers",
    "n_head": "n_heads",
    "seq_length": "max_len",
}
MARIAN_NAMES = {
    "d_model": "d_model",
    "max_position_embeddings": "max_len",
    **{f"{side}_layers": "n_layers" for side in ("encoder", "decoder")},
    **{f"{side}_attention_heads": "n_heads" for side in ("encoder", "decoder")},
    **{f"{side}_ffn_dim": "d_ff" for side in ("encoder", "decoder")},
}
# T5 v1.1 / Flan-T5: heads of their own width (d_kv 16, 4 heads in 32), gated-gelu, an own lm_head.
T5_NAMES = {
    "d_model": "d_model",
    "num_layers": "n_layers",
    "num_heads": "n_heads",
    "d_ff": "d_ff",
    "n_positions": "max_len",
}
GPT2_NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
MARIAN_NO_DROPOUT = {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}
# The twins number their special tokens as attnkit's tokenizers do.
TWIN_IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def family_config(
    cls: type[PretrainedConfig], names: dict[str, str], sizes: dict[str, int], **extra
) -> PretrainedConfig:
    """A config of `cls` with `sizes` (attnkit's names) under the family's `names` for them.

    A size missing from `sizes` is left at the family's default; `extra` wins over `sizes`.
    """
    renamed = {theirs: sizes[ours] for theirs, ours in names.items() if ours in sizes}
    return cls(**{"vocab_size": sizes["vocab_size"], **renamed, **extra})


def gpt2_config(
    n_layers: int, d_model: int, n_heads: int, vocab_size: int, max_len: int, **extra
) -> GPT2Config:
    """GPT-2 of these sizes without dropout (its feed-forward width is its own 4 x d_model)."""
    sizes = {"n_layers": n_layers, "d_model": d_model, "n_heads": n_heads, "max_len": max_len}
    return family_config(
        GPT2Config, GPT2_NAMES, {"vocab_size": vocab_size, **sizes}, **GPT2_NO_DROPOUT, **extra
    )


def _gpt2(**extra) -> GPT2Config:
    ids = {"bos_token_id": VOCAB - 1, "eos_token_id": VOCAB - 1}
    return family_config(GPT2Config, GPT2_NAMES, TINY, **ids, **extra)


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
    return family_config(
        cls, HIDDEN_NAMES, TINY, num_key_value_heads=2, rope_parameters=rope, **extra
    )


def marian_config(**extra) -> MarianConfig:
    options = {
        "activation_function": "swish",
        "scale_embedding": True,
        "pad_token_id": 50,
        "decoder_start_token_id": 50,
        "eos_token_id": 0,
    }
    return family_config(MarianConfig, MARIAN_NAMES, TINY, **{**options, **extra})


def t5_config(**extra) -> T5Config:
    """Flan-T5's shape, small: gated-gelu, d_kv apart from d_model / heads, few buckets (8 up
    to distance 12) so that the test sequences reach the log-spaced ones, an own lm_head."""
    options = {
        "d_kv": 16,
        "feed_forward_proj": "gated-gelu",
        "relative_attention_num_buckets": 8,
        "relative_attention_max_distance": 12,
        "tie_word_embeddings": False,
        "dropout_rate": 0.0,
        "decoder_start_token_id": 0,
    }
    return family_config(T5Config, T5_NAMES, TINY, **{**options, **extra})


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
        lambda: family_config(BloomConfig, BLOOM_NAMES, {**TINY, "d_model": 36, "n_heads": 6}),
    ),
    "bert": (BertModel, lambda: family_config(BertConfig, HIDDEN_NAMES, TINY)),
    "marian": (MarianMTModel, marian_config),
    "marian-separate": (
        MarianMTModel,
        lambda: marian_config(share_encoder_decoder_embeddings=False, decoder_vocab_size=53),
    ),
    "t5": (T5ForConditionalGeneration, t5_config),
    # T5 v1.1's shape on the first T5's plain ReLU feed-forward network.
    "t5-relu": (T5ForConditionalGeneration, lambda: t5_config(feed_forward_proj="relu")),
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


def random_model(
    cls: type[PreTrainedModel], config: PretrainedConfig, seed: int, scale: float = 0.0
) -> PreTrainedModel:
    """A `cls` initialised from `seed`, with noise of `scale` on every weight when given."""
    torch.manual_seed(seed)
    model = cls(config)
    return randomize(model, seed, scale) if scale else model


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
    random_model(cls, config, seed, scale).save_pretrained(path)
    if case.startswith("t5"):
        flan_t5_head(Path(path), seed)
    return cls.from_pretrained(path, attn_implementation="eager").eval()


def flan_t5_head(path: Path, seed: int) -> None:
    """Give the saved T5 an lm_head of its own, as T5 v1.1 and Flan-T5 ship (transformers 5
    ties it to `shared` when it builds a T5, and saves no lm_head.weight)."""
    weights = load_file(path / "model.safetensors")
    generator = torch.Generator().manual_seed(seed + 1)
    weights["lm_head.weight"] = torch.randn(weights["shared.weight"].shape, generator=generator)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config.pop("scale_decoder_outputs", None)
    (path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))


def twins(
    cls: type[PreTrainedModel], config: PretrainedConfig, seed: int
) -> tuple[TransformerModel, PreTrainedModel]:
    """A random `cls` and the attnkit model read from its saved folder, both in eval mode."""
    hf = random_model(cls, config, seed).eval()
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        return load_hf(folder).model.eval(), hf


def gpt2_twins(
    n_layers: int, d_model: int, n_heads: int, vocab_size: int, max_len: int, seed: int = 0
) -> tuple[TransformerModel, GPT2LMHeadModel]:
    """A random GPT-2 and the attnkit `DecoderOnly` with its weights."""
    config = gpt2_config(n_layers, d_model, n_heads, vocab_size, max_len, **TWIN_IDS)
    return twins(GPT2LMHeadModel, config, seed)


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
    and the attnkit `DecoderOnly` with its weights."""
    sizes = {"n_layers": n_layers, "d_model": d_model, "n_heads": n_heads, "max_len": max_len}
    config = family_config(
        MistralConfig,
        HIDDEN_NAMES,
        {"vocab_size": vocab_size, "d_ff": 2 * d_model, **sizes},
        num_key_value_heads=2,
        sliding_window=sliding_window,
        tie_word_embeddings=True,
        # With the default 0.02 the tied embedding dominates and every step repeats
        # the last token; larger weights make the decoding exercise attention.
        initializer_range=0.3,
        **TWIN_IDS,
    )
    return twins(MistralForCausalLM, config, seed)


def bloom_twins(
    n_layers: int, d_model: int, n_heads: int, vocab_size: int, seed: int = 0
) -> tuple[TransformerModel, BloomForCausalLM]:
    """A random BLOOM (ALiBi, no position vectors) and the attnkit `DecoderOnly` with its
    weights."""
    sizes = {"vocab_size": vocab_size, "n_layers": n_layers, "d_model": d_model, "n_heads": n_heads}
    # As mistral_twins: so that decoding exercises attention.
    config = family_config(BloomConfig, BLOOM_NAMES, sizes, initializer_range=0.3, **TWIN_IDS)
    return twins(BloomForCausalLM, config, seed)


def marian_twins(
    n_layers: int, d_model: int, n_heads: int, vocab_size: int, max_len: int, seed: int = 0
) -> tuple[TransformerModel, MarianMTModel]:
    """A random Marian model and the attnkit `EncoderDecoder` with its weights.

    Marian starts the decoder with its pad id (0 here) and its default config
    forces EOS at the last step; that is switched off so plain decoding is compared.
    """
    sizes = {"n_layers": n_layers, "d_model": d_model, "n_heads": n_heads, "max_len": max_len}
    config = family_config(
        MarianConfig,
        MARIAN_NAMES,
        {"vocab_size": vocab_size, "d_ff": 4 * d_model, **sizes},
        activation_function="relu",
        **MARIAN_NO_DROPOUT,
        pad_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=0,
        forced_eos_token_id=None,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
    )
    ours, hf = twins(MarianMTModel, config, seed)
    hf.generation_config.forced_eos_token_id = None
    hf.generation_config.bad_words_ids = None
    return ours, hf


def parity_batch(model: TransformerModel, seed: int = 0) -> dict[str, Tensor]:
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


def before_eos(rows: list[list[int]], eos: int) -> list[list[int]]:
    """Each row of ids cut at its first `eos`: what both sides generated, padding aside."""
    return [row[: row.index(eos)] if eos in row else row for row in rows]
