"""LLaMA, Mistral and Mixtral <-> attnkit: decoder-only, pre-norm, RMSNorm, RoPE, SwiGLU.

    h_l = h' + SwiGLU(RMSNorm_2(h')),  h' = h_{l-1} + Attn(RMSNorm_1(h_{l-1}), RoPE)
    logits = RMSNorm_f(h_L) W_out

Keys and values may have fewer heads than queries (grouped-query attention).
Hugging Face stores q, k and v apart and the SwiGLU's gate and up projections
apart; attnkit fuses each set into one matrix. Its checkpoints already lay the
rotary pairs out as (x_i, x_{i+d/2}), the layout of attnkit's RoPE. Mistral is
the same network with a sliding attention window; Mixtral replaces each SwiGLU
with a mixture of SwiGLU experts (w1 the gate, w3 the up, w2 the down
projection of each) under a top-k router.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.interop.hfconfig import require, special_id
from attnkit.interop.mapping import Family, Rule, lm_head, module
from attnkit.nn.positional import HIGH_FREQ_FACTOR, LOW_FREQ_FACTOR


def _rope_settings(hf: dict[str, Any]) -> dict[str, Any]:
    """attnkit's rope_ settings from `rope_parameters` (transformers 5) or the older keys.

    Plain, linear and Llama 3.1's scaling are computed alike; the others are refused.
    """
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    if kind == "default":
        return {"rope_theta": theta}
    if kind == "linear":
        return {"rope_theta": theta, "rope_scaling": params["factor"], "rope_scaling_type": kind}
    factors = (params.get("low_freq_factor"), params.get("high_freq_factor"))
    if kind == "llama3" and factors == (LOW_FREQ_FACTOR, HIGH_FREQ_FACTOR):
        return {
            "rope_theta": theta,
            "rope_scaling": params["factor"],
            "rope_scaling_type": kind,
            "rope_original_max_len": params["original_max_position_embeddings"],
        }
    raise AttnkitError(
        f"RoPE scaling of type {kind!r} (with {params}) is not supported by attnkit, which "
        f"computes plain RoPE, linear scaling, and llama3 scaling with low_freq_factor "
        f"{LOW_FREQ_FACTOR} and high_freq_factor {HIGH_FREQ_FACTOR} (every Llama 3.x release)"
    )


def _rope_parameters(c: ModelConfig) -> dict[str, Any]:
    """`rope_parameters` of transformers 5 for attnkit's rope_ settings.

    transformers has no static NTK-aware scaling: such a model comes back
    unscaled, so `Family.hf_config` refuses to export it.
    """
    if c.rope_scaling_type == "ntk":
        return {"rope_type": "default", "rope_theta": c.rope_theta}
    params = {
        "rope_type": c.rope_scaling_type,
        "rope_theta": c.rope_theta,
        "factor": c.rope_scaling,
    }
    if c.rope_scaling_type == "llama3":
        params |= {
            "low_freq_factor": LOW_FREQ_FACTOR,
            "high_freq_factor": HIGH_FREQ_FACTOR,
            "original_max_position_embeddings": c.rope_original_max_len,
        }
    return params


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    family = hf.get("model_type", "llama")
    require(hf, family, {"hidden_act": "silu", "pretraining_tp": 1, "router_jitter_noise": 0.0})
    d_model, n_heads = hf.get("hidden_size", 4096), hf.get("num_attention_heads", 32)
    head_dim = hf.get("head_dim") or d_model // n_heads
    if head_dim * n_heads != d_model:
        raise AttnkitError(
            f"{family} head_dim {head_dim} times {n_heads} heads is not hidden_size {d_model}; "
            "attnkit's heads split d_model evenly"
        )
    bias = hf.get("attention_bias", False)
    require(hf, family, {"mlp_bias": bias})
    vocab_size = hf.get("vocab_size", 32000)
    return ModelConfig(
        shape="decoder",
        vocab_size=vocab_size,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        n_decoder_layers=hf.get("num_hidden_layers", 32),
        d_ff=hf.get("intermediate_size", 11008),
        dropout=0.0,
        attention_dropout=hf.get("attention_dropout", 0.0),
        embedding_dropout=0.0,
        activation="swiglu",
        norm="rmsnorm",
        norm_position="pre",
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        final_norm=True,
        positional="rope",
        **_rope_settings(hf),
        attention_window=hf.get("sliding_window") or 0,
        n_experts=hf.get("num_local_experts", 0),
        n_experts_per_token=hf.get("num_experts_per_tok", 2),
        router_aux_loss_coef=hf.get("router_aux_loss_coef", 0.01),
        max_len=hf.get("max_position_embeddings", 2048),
        scale_embeddings=False,
        tie_embeddings="decoder" if hf.get("tie_word_embeddings", False) else "none",
        bias=bias,
        pad_id=special_id(hf, "pad_token_id", vocab_size) or 0,
        eos_id=special_id(hf, "eos_token_id", vocab_size),
    )


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
    return {
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.d_head,
        "num_hidden_layers": c.n_decoder_layers,
        "intermediate_size": c.d_ff,
        "attention_dropout": c.attention_dropout,
        "hidden_act": "silu",
        "rms_norm_eps": c.norm_eps,
        "rope_parameters": _rope_parameters(c),
        "max_position_embeddings": c.max_len,
        "tie_word_embeddings": c.tie_embeddings == "decoder",
        "attention_bias": c.bias,
        "mlp_bias": c.bias,
        "pad_token_id": c.pad_id,
        "eos_token_id": c.eos_id,
    }


def mistral_config_to_hf(c: ModelConfig) -> dict[str, Any]:
    return {**config_to_hf(c), "sliding_window": c.attention_window or None}


def mixtral_config_to_hf(c: ModelConfig) -> dict[str, Any]:
    return {
        **mistral_config_to_hf(c),
        "num_local_experts": c.n_experts,
        "num_experts_per_tok": c.n_experts_per_token,
        "router_aux_loss_coef": c.router_aux_loss_coef,
    }


def _feed_forward(c: ModelConfig, ours: str, theirs: str) -> list[Rule]:
    """The SwiGLU of one layer (`mlp`), or its mixture of experts (`block_sparse_moe`)."""
    if not c.n_experts:
        gate_up = (f"{theirs}.mlp.gate_proj", f"{theirs}.mlp.up_proj")
        return [
            *module(f"{ours}.ff.w_1", gate_up, "concat", bias=c.bias),
            *module(f"{ours}.ff.w_2", f"{theirs}.mlp.down_proj", bias=c.bias),
        ]
    moe = f"{theirs}.block_sparse_moe"
    out = module(f"{ours}.ff.router", f"{moe}.gate", bias=False)
    for e in range(c.n_experts):
        expert = f"{moe}.experts.{e}"
        out += module(
            f"{ours}.ff.experts.{e}.w_1", (f"{expert}.w1", f"{expert}.w3"), "concat", bias=False
        )
        out += module(f"{ours}.ff.experts.{e}.w_2", f"{expert}.w2", bias=False)
    return out


def rules(c: ModelConfig) -> list[Rule]:
    embed, head = lm_head(c, "model.embed_tokens.weight")
    q_rows, kv_rows = c.n_heads * c.d_head, c.n_kv_heads * c.d_head
    out = [embed]
    for i in range(c.n_decoder_layers):
        ours, theirs = f"decoder.blocks.{i}", f"model.layers.{i}"
        qkv = tuple(f"{theirs}.self_attn.{n}_proj" for n in "qkv")
        out += module(
            f"{ours}.self_attn.qkv_proj",
            qkv,
            "concat",
            bias=c.bias,
            sizes=(q_rows, kv_rows, kv_rows),
        )
        out += module(f"{ours}.self_attn.out_proj", f"{theirs}.self_attn.o_proj", bias=c.bias)
        out += module(f"{ours}.self_attn_residual.norm", f"{theirs}.input_layernorm", bias=False)
        out += _feed_forward(c, ours, theirs)
        out += module(f"{ours}.ff_residual.norm", f"{theirs}.post_attention_layernorm", bias=False)
    out += module("decoder.norm", "model.norm", bias=False)
    return out + head


def _family(
    model_type: str, architecture: str, to_hf: Callable[[ModelConfig], dict[str, Any]]
) -> Family:
    return Family(
        model_type=model_type,
        architecture=architecture,
        shape="decoder",
        prefix="model.",
        prefixed=True,
        top_level=frozenset({"lm_head.weight"}),
        config_from_hf=config_from_hf,
        config_to_hf=to_hf,
        rules=rules,
        derived=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
    )


LLAMA = _family("llama", "LlamaForCausalLM", config_to_hf)
MISTRAL = _family("mistral", "MistralForCausalLM", mistral_config_to_hf)
MIXTRAL = _family("mixtral", "MixtralForCausalLM", mixtral_config_to_hf)
