"""BLOOM <-> attnkit: a decoder-only, pre-LN Transformer with ALiBi and no position vectors.

    h_0 = LN_emb(W_word[ids])
    h_l = h' + MLP(LN_2(h')),  h' = h_{l-1} + Attn(LN_1(h_{l-1})),  scores + ALiBi
    logits = LN_f(h_L) W_word^T

BLOOM adds slope_h * j for key j where attnkit adds -slope_h |i - j|: the two
differ by a constant along each query's row, which the softmax removes. Its
fused query_key_value runs head by head (q, k, v of head 1, then of head 2...);
attnkit's runs q of every head, then k, then v. Its GELU is the tanh
approximation and its feed-forward width is 4 d_model. The config holds no
length (ALiBi has none); attnkit keeps `seq_length`, BLOOM's training length,
2,048 by default.
"""

from __future__ import annotations

from typing import Any

from attnkit.config import ModelConfig
from attnkit.interop.hfconfig import require, special_id
from attnkit.interop.mapping import Family, Rule, lm_head, module


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    require(hf, "bloom", {"apply_residual_connection_post_layernorm": False})
    d_model, vocab_size = hf.get("hidden_size", 64), hf.get("vocab_size", 250880)
    dropout = hf.get("hidden_dropout", 0.0)
    return ModelConfig(
        shape="decoder",
        vocab_size=vocab_size,
        d_model=d_model,
        n_heads=hf.get("n_head", 8),
        n_decoder_layers=hf.get("n_layer", 2),
        d_ff=4 * d_model,
        dropout=dropout,
        attention_dropout=hf.get("attention_dropout", 0.0),
        embedding_dropout=dropout,
        activation="gelu_tanh",
        norm_position="pre",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        final_norm=True,
        positional="alibi",
        max_len=hf.get("seq_length", 2048),
        scale_embeddings=False,
        tie_embeddings="decoder" if hf.get("tie_word_embeddings", True) else "none",
        embedding_norm=True,
        pad_id=special_id(hf, "pad_token_id", vocab_size) or 0,
        eos_id=special_id(hf, "eos_token_id", vocab_size),
    )


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
    return {
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "n_head": c.n_heads,
        "n_layer": c.n_decoder_layers,
        "hidden_dropout": c.dropout,
        "attention_dropout": c.attention_dropout,
        "layer_norm_epsilon": c.norm_eps,
        "seq_length": c.max_len,
        "tie_word_embeddings": c.tie_embeddings == "decoder",
        "pad_token_id": c.pad_id,
        "eos_token_id": c.eos_id,
    }


def rules(c: ModelConfig) -> list[Rule]:
    embed, head = lm_head(c, "transformer.word_embeddings.weight")
    out = [
        embed,
        *module("embed.norm", "transformer.word_embeddings_layernorm"),
    ]
    for i in range(c.n_decoder_layers):
        ours, theirs = f"decoder.blocks.{i}", f"transformer.h.{i}"
        qkv = f"{theirs}.self_attention.query_key_value"
        out += module(f"{ours}.self_attn_residual.norm", f"{theirs}.input_layernorm")
        out += module(f"{ours}.self_attn.qkv_proj", qkv, "per-head", heads=c.n_heads)
        out += module(f"{ours}.self_attn.out_proj", f"{theirs}.self_attention.dense")
        out += module(f"{ours}.ff_residual.norm", f"{theirs}.post_attention_layernorm")
        out += module(f"{ours}.ff.w_1", f"{theirs}.mlp.dense_h_to_4h")
        out += module(f"{ours}.ff.w_2", f"{theirs}.mlp.dense_4h_to_h")
    out += module("decoder.norm", "transformer.ln_f")
    return out + head


BLOOM = Family(
    model_type="bloom",
    architecture="BloomForCausalLM",
    shape="decoder",
    prefix="transformer.",
    prefixed=True,
    top_level=frozenset({"lm_head.weight"}),
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    rules=rules,
)
