"""T5 <-> attnkit: the T5 v1.1 / Flan-T5 encoder-decoder (Raffel et al. 2020).

    x_0 = E[ids]                                  (no scaling, no position vectors)
    score(i, j) = q_i . k_j + b_h[bucket(j - i)]  (unscaled; one bias table a stack)
    h = x + Attn(RMSNorm(x)),  h + FFN(RMSNorm(h))   (pre-norm, no biases anywhere)
    FFN(x) = (GELU_tanh(x W_0) * x W_1) W_o       (gated-gelu)
    logits = RMSNorm_final(Decoder(...)) W_lm^T

Every difference from the paper's Transformer is a `ModelConfig` field:
`positional = "t5-relative"` (the bias table sits in block 0 of each stack in the
checkpoint, and is one table of the stack in attnkit), `scale_scores = False`,
`head_dim = d_kv`, `norm = "rmsnorm"` before each sub-layer, `bias = False`,
`activation = "geglu_tanh"` (W_0 and W_1 stacked, gate first, into `w_1`).

Embeddings: one `shared` table feeds both stacks, and the output has its own
`lm_head` (`tie_embeddings = "inputs"`), as T5 v1.1 and Flan-T5 ship. Transformers
5 writes every T5 config as tied (`scale_decoder_outputs` false says it is v1.1)
and saves `lm_head.weight` only where it differs from `shared`, so a checkpoint
without one reads `shared` for the head. The original T5 (v1.0) multiplies the
decoder's output by d_model^-0.5 before its tied head, which attnkit has no field
for, so it is refused in one sentence.

An attnkit model whose output layer is tied to both embeddings (`tie_embeddings =
"all"`, logits = h E^T, unscaled) is exported in T5 v1.1's form: `lm_head.weight` a
copy of `shared` and `tie_word_embeddings` false. T5 v1.0's tying would not be the
same function, since its tied head reads the output times d_model^-0.5; the copy is.
Imported back, the model has `tie_embeddings = "inputs"` and the same outputs.

T5 has no length limit of its own; attnkit's `max_len` (the bias table and the
longest generation) is written as `n_positions`, 512 when absent.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.interop.hfconfig import setting, special_id
from attnkit.interop.mapping import Family, Rule, module

# feed_forward_proj's function (after "gated-", if any) -> attnkit's activation, plain and gated.
PLAIN = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "silu": "silu"}
GATED = {"gelu_new": "geglu_tanh", "gelu": "geglu", "silu": "swiglu"}
ACTIVATIONS_TO_HF = {
    **{ours: theirs for theirs, ours in PLAIN.items()},
    **{ours: f"gated-{theirs}" for theirs, ours in GATED.items()},
}
# transformers' own name for gated-gelu_new ("gated-gelu" means the tanh approximation).
ACTIVATIONS_TO_HF["geglu_tanh"] = "gated-gelu"


def _activation(proj: str) -> str:
    gated = proj.startswith("gated-")
    name = "gelu_new" if proj == "gated-gelu" else proj.removeprefix("gated-")
    table = GATED if gated else PLAIN
    if name not in table:
        raise AttnkitError(
            f"t5 feed_forward_proj {proj!r} is not supported; the supported ones are "
            f"{', '.join(sorted(ACTIVATIONS_TO_HF.values()))}"
        )
    return table[name]


def _check_unscaled(hf: dict[str, Any]) -> None:
    """Refuse the original T5's scaled output (tied and not marked otherwise)."""
    scaled = hf.get("tie_word_embeddings", True) is not False
    if hf.get("scale_decoder_outputs", scaled):
        raise AttnkitError(
            "this t5 model is the original T5 (v1.0), which scales the decoder's output by "
            "d_model^-0.5 before its tied output layer; attnkit computes T5 v1.1 and Flan-T5 "
            "(tie_word_embeddings false or scale_decoder_outputs false)"
        )


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    _check_unscaled(hf)
    vocab = setting(hf, "vocab_size", 32128)
    dropout = setting(hf, "dropout_rate", 0.1, float)
    n_layers = setting(hf, "num_layers", 6)
    pad = special_id(hf, "pad_token_id", vocab)
    start = special_id(hf, "decoder_start_token_id", vocab)
    return ModelConfig(
        shape="encoder-decoder",
        vocab_size=vocab,
        src_vocab_size=vocab,
        d_model=setting(hf, "d_model", 512),
        n_heads=setting(hf, "num_heads", 8),
        head_dim=setting(hf, "d_kv", 64),
        n_encoder_layers=n_layers,
        n_decoder_layers=setting(hf, "num_decoder_layers", n_layers),
        d_ff=setting(hf, "d_ff", 2048),
        # T5 drops out sub-layer outputs, attention weights, the hidden activations of the
        # feed-forward and the embeddings, all at one rate.
        dropout=dropout,
        attention_dropout=dropout,
        activation_dropout=dropout,
        embedding_dropout=dropout,
        activation=_activation(setting(hf, "feed_forward_proj", "relu", str)),
        norm="rmsnorm",
        norm_eps=setting(hf, "layer_norm_epsilon", 1e-6, float),
        norm_position="pre",
        bias=False,
        positional="t5-relative",
        relative_buckets=setting(hf, "relative_attention_num_buckets", 32),
        relative_max_distance=setting(hf, "relative_attention_max_distance", 128),
        scale_scores=False,
        scale_embeddings=False,
        max_len=setting(hf, "n_positions", 512),
        tie_embeddings="inputs",
        pad_id=0 if pad is None else pad,
        decoder_start_id=pad if start is None else start,
        eos_id=special_id(hf, "eos_token_id", vocab),
    )


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
    if c.activation not in ACTIVATIONS_TO_HF:
        raise AttnkitError(
            f"activation {c.activation!r} has no place in t5, which takes "
            f"{', '.join(ACTIVATIONS_TO_HF)}"
        )
    return {
        "vocab_size": c.vocab_size,
        "d_model": c.d_model,
        "d_kv": c.d_head,
        "d_ff": c.d_ff,
        "num_heads": c.n_heads,
        "num_layers": c.n_encoder_layers,
        "num_decoder_layers": c.n_decoder_layers,
        "relative_attention_num_buckets": c.relative_buckets,
        "relative_attention_max_distance": c.relative_max_distance,
        "dropout_rate": c.dropout,
        "layer_norm_epsilon": c.norm_eps,
        "feed_forward_proj": ACTIVATIONS_TO_HF[c.activation],
        "tie_word_embeddings": False,
        "n_positions": c.max_len,
        "pad_token_id": c.pad_id,
        "eos_token_id": c.eos_id,
        "decoder_start_token_id": c.decoder_start_id,
        "is_encoder_decoder": True,
    }


def untied_head(c: ModelConfig) -> ModelConfig:
    """The config T5 writes for `c`: a head tied to both embeddings becomes a head of its own
    holding a copy (`inputs`), the function unchanged (module docstring)."""
    return dataclasses.replace(c, tie_embeddings="inputs") if c.tie_embeddings == "all" else c


def _attention(ours: str, theirs: str, cross: bool) -> list[Rule]:
    names = ("k", "v") if cross else ("q", "k", "v")
    fused = "kv_proj" if cross else "qkv_proj"
    out = module(f"{ours}.{fused}", tuple(f"{theirs}.{n}" for n in names), "concat", bias=False)
    if cross:
        out += module(f"{ours}.q_proj", f"{theirs}.q", bias=False)
    return [*out, *module(f"{ours}.out_proj", f"{theirs}.o", bias=False)]


def _layer(c: ModelConfig, ours: str, theirs: str, cross: bool) -> list[Rule]:
    ff = f"{theirs}.layer.{2 if cross else 1}"
    dense = f"{ff}.DenseReluDense"
    gated = c.activation in GATED.values()
    w_1 = (f"{dense}.wi_0", f"{dense}.wi_1") if gated else f"{dense}.wi"
    out = [
        *_attention(f"{ours}.self_attn", f"{theirs}.layer.0.SelfAttention", False),
        *module(f"{ours}.self_attn_residual.norm", f"{theirs}.layer.0.layer_norm", bias=False),
        *module(f"{ours}.ff.w_1", w_1, "concat" if gated else "copy", bias=False),
        *module(f"{ours}.ff.w_2", f"{dense}.wo", bias=False),
        *module(f"{ours}.ff_residual.norm", f"{ff}.layer_norm", bias=False),
    ]
    if cross:
        out += [
            *_attention(f"{ours}.cross_attn", f"{theirs}.layer.1.EncDecAttention", True),
            *module(f"{ours}.cross_attn_residual.norm", f"{theirs}.layer.1.layer_norm", bias=False),
        ]
    return out


def rules(c: ModelConfig) -> list[Rule]:
    inputs = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
    out = [
        Rule("src_embed.token.weight", ("shared.weight",), aliases=inputs),
        Rule("head.weight", ("lm_head.weight",), fallback="shared.weight"),
    ]
    for side in ("encoder", "decoder"):
        bias = f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        out.append(Rule(f"{side}.relative_bias.weight", (bias,)))
        out += module(f"{side}.norm", f"{side}.final_layer_norm", bias=False)
        n_layers = c.n_encoder_layers if side == "encoder" else c.n_decoder_layers
        for i in range(n_layers):
            out += _layer(c, f"{side}.blocks.{i}", f"{side}.block.{i}", side == "decoder")
    return out


T5 = Family(
    model_type="t5",
    architecture="T5ForConditionalGeneration",
    shape="encoder-decoder",
    prefix="",
    prefixed=False,
    top_level=frozenset({"lm_head.weight"}),
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    rules=rules,
    written_as=untied_head,
)
