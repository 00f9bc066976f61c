"""BERT <-> attnkit: an encoder-only, post-LN Transformer with learned positions.

    h_0 = LN(W_word[ids] + W_pos[positions] + W_type[token_types])
    h_l = LN(h' + FFN(h')),  h' = LN(h_{l-1} + Attn(h_{l-1}))

The same `Block` as the paper's encoder; BERT differs only in its embedding
(token types, a norm after the sum), exact GELU and eps 1e-12. The pooler and
the pre-training heads are not part of the encoder; an import reports them as
unused.
"""

from __future__ import annotations

from typing import Any

from attnkit.config import ModelConfig
from attnkit.interop.hfconfig import activation_from_hf, activation_to_hf, require, special_id
from attnkit.interop.mapping import Family, Rule, module


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    require(
        hf,
        "bert",
        {"position_embedding_type": "absolute", "is_decoder": False, "add_cross_attention": False},
    )
    vocab_size, dropout = hf.get("vocab_size", 30522), hf.get("hidden_dropout_prob", 0.1)
    return ModelConfig(
        shape="encoder",
        vocab_size=vocab_size,
        d_model=hf.get("hidden_size", 768),
        n_heads=hf.get("num_attention_heads", 12),
        n_encoder_layers=hf.get("num_hidden_layers", 12),
        d_ff=hf.get("intermediate_size", 3072),
        dropout=dropout,
        attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
        embedding_dropout=dropout,
        activation=activation_from_hf(hf.get("hidden_act", "gelu")),
        norm_position="post",
        norm_eps=hf.get("layer_norm_eps", 1e-12),
        positional="learned",
        max_len=hf.get("max_position_embeddings", 512),
        scale_embeddings=False,
        # The masked-LM decoder is tied to the word embeddings.
        tie_embeddings="decoder",
        pad_id=special_id(hf, "pad_token_id", vocab_size) or 0,
        n_token_types=hf.get("type_vocab_size", 2),
        embedding_norm=True,
    )


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
    return {
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "num_attention_heads": c.n_heads,
        "num_hidden_layers": c.n_encoder_layers,
        "intermediate_size": c.d_ff,
        "hidden_dropout_prob": c.dropout,
        "attention_probs_dropout_prob": c.attention_dropout,
        "hidden_act": activation_to_hf(c.activation),
        "layer_norm_eps": c.norm_eps,
        "max_position_embeddings": c.max_len,
        "pad_token_id": c.pad_id,
        "type_vocab_size": c.n_token_types,
    }


def rules(c: ModelConfig) -> list[Rule]:
    out = [
        Rule("embed.token.weight", ("embeddings.word_embeddings.weight",)),
        Rule("embed.positions.table", ("embeddings.position_embeddings.weight",)),
        *module("embed.norm", "embeddings.LayerNorm"),
    ]
    if c.n_token_types:
        out.append(Rule("embed.token_types.weight", ("embeddings.token_type_embeddings.weight",)))
    for i in range(c.n_encoder_layers):
        ours, theirs = f"encoder.blocks.{i}", f"encoder.layer.{i}"
        qkv = tuple(f"{theirs}.attention.self.{n}" for n in ("query", "key", "value"))
        out += module(f"{ours}.self_attn.qkv_proj", qkv, "concat")
        out += module(f"{ours}.self_attn.out_proj", f"{theirs}.attention.output.dense")
        out += module(f"{ours}.self_attn_residual.norm", f"{theirs}.attention.output.LayerNorm")
        out += module(f"{ours}.ff.w_1", f"{theirs}.intermediate.dense")
        out += module(f"{ours}.ff.w_2", f"{theirs}.output.dense")
        out += module(f"{ours}.ff_residual.norm", f"{theirs}.output.LayerNorm")
    return out


BERT = Family(
    model_type="bert",
    architecture="BertModel",
    shape="encoder",
    prefix="bert.",
    prefixed=False,
    top_level=frozenset(),
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    rules=rules,
    derived=(r"embeddings\.(position_ids|token_type_ids)",),
)
