"""GPT-2 <-> attnkit: a decoder-only, pre-LN Transformer with learned positions.

    h_0 = W_te[ids] + W_pe[positions]
    h_l = h' + MLP(LN_2(h')),  h' = h_{l-1} + Attn(LN_1(h_{l-1}))
    logits = LN_f(h_L) W_te^T

GPT-2 stores its linear layers as Conv1D, whose weight is W^T (in x out), and
fuses Q, K, V in one `c_attn` in the order attnkit's `qkv_proj` uses.
"""

from __future__ import annotations

from typing import Any

from attnkit.config import ModelConfig
from attnkit.interop.hfconfig import activation_from_hf, activation_to_hf, require, special_id
from attnkit.interop.mapping import Family, Rule, lm_head, module


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    require(
        hf,
        "gpt2",
        {
            "add_cross_attention": False,
            "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False,
        },
    )
    d_model, vocab_size = hf.get("n_embd", 768), hf.get("vocab_size", 50257)
    return ModelConfig(
        shape="decoder",
        vocab_size=vocab_size,
        d_model=d_model,
        n_heads=hf.get("n_head", 12),
        n_decoder_layers=hf.get("n_layer", 12),
        d_ff=hf.get("n_inner") or 4 * d_model,
        dropout=hf.get("resid_pdrop", 0.1),
        attention_dropout=hf.get("attn_pdrop", 0.1),
        embedding_dropout=hf.get("embd_pdrop", 0.1),
        activation=activation_from_hf(hf.get("activation_function", "gelu_new")),
        norm_position="pre",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        final_norm=True,
        positional="learned",
        max_len=hf.get("n_positions", 1024),
        scale_embeddings=False,
        tie_embeddings="decoder" if hf.get("tie_word_embeddings", True) else "none",
        pad_id=special_id(hf, "pad_token_id", vocab_size) or 0,
        eos_id=special_id(hf, "eos_token_id", vocab_size),
    )


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
    return {
        "vocab_size": c.vocab_size,
        "n_embd": c.d_model,
        "n_head": c.n_heads,
        "n_layer": c.n_decoder_layers,
        "n_inner": c.d_ff,
        "resid_pdrop": c.dropout,
        "attn_pdrop": c.attention_dropout,
        "embd_pdrop": c.embedding_dropout,
        "activation_function": activation_to_hf(c.activation),
        "layer_norm_epsilon": c.norm_eps,
        "n_positions": c.max_len,
        "tie_word_embeddings": c.tie_embeddings == "decoder",
        "pad_token_id": c.pad_id,
        # GPT-2 begins and ends documents with the same token.
        "bos_token_id": c.eos_id,
        "eos_token_id": c.eos_id,
    }


def rules(c: ModelConfig) -> list[Rule]:
    embed, head = lm_head(c, "transformer.wte.weight")
    out = [
        embed,
        Rule("embed.positions.table", ("transformer.wpe.weight",)),
    ]
    for i in range(c.n_decoder_layers):
        ours, theirs = f"decoder.blocks.{i}", f"transformer.h.{i}"
        out += module(f"{ours}.self_attn_residual.norm", f"{theirs}.ln_1")
        out += module(f"{ours}.self_attn.qkv_proj", f"{theirs}.attn.c_attn", "transpose")
        out += module(f"{ours}.self_attn.out_proj", f"{theirs}.attn.c_proj", "transpose")
        out += module(f"{ours}.ff_residual.norm", f"{theirs}.ln_2")
        out += module(f"{ours}.ff.w_1", f"{theirs}.mlp.c_fc", "transpose")
        out += module(f"{ours}.ff.w_2", f"{theirs}.mlp.c_proj", "transpose")
    out += module("decoder.norm", "transformer.ln_f")
    return out + head


GPT2 = Family(
    model_type="gpt2",
    architecture="GPT2LMHeadModel",
    shape="decoder",
    prefix="transformer.",
    prefixed=True,
    top_level=frozenset({"lm_head.weight"}),
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    rules=rules,
    # Old checkpoints store each layer's causal mask; attnkit builds it.
    derived=(r"transformer\.h\.\d+\.attn\.(bias|masked_bias)",),
)
