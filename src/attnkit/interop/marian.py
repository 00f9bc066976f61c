"""Marian <-> attnkit: the paper's encoder-decoder, as the OPUS-MT models ship it.

    x_0 = E[ids] * sqrt(d_model) + PE_split[positions]
    logits = Decoder(y, Encoder(x)) E^T + b                    (b: final_logits_bias)

Post-LN blocks with no final norm, exactly the paper's; the differences are
the sinusoidal table's `split` layout (all sines, then all cosines), the
logits bias, SiLU ("swish") in trained models, and decoding that starts from
the pad id. One embedding is shared by the encoder, the decoder and the output
projection unless `share_encoder_decoder_embeddings` is off.
"""

from __future__ import annotations

from typing import Any

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.interop.hfconfig import activation_from_hf, activation_to_hf, require, special_id
from attnkit.interop.mapping import Family, Rule, module

# Options of older Marian configs that switch on BART-like variants attnkit does not compute.
VARIANTS = {
    "normalize_before": False,
    "normalize_embedding": False,
    "add_final_layer_norm": False,
    "add_bias_logits": False,
    "static_position_embeddings": True,
}


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    require(hf, "marian", VARIANTS)
    for ours, encoder, decoder, default in (
        ("n_heads", "encoder_attention_heads", "decoder_attention_heads", 16),
        ("d_ff", "encoder_ffn_dim", "decoder_ffn_dim", 4096),
    ):
        if hf.get(encoder, default) != hf.get(decoder, default):
            raise AttnkitError(
                f"this marian model has {encoder}={hf.get(encoder, default)} but "
                f"{decoder}={hf.get(decoder, default)}; attnkit uses one {ours} for both stacks"
            )
    share = hf.get("share_encoder_decoder_embeddings", True)
    tied = hf.get("tie_word_embeddings", True)
    if share and not tied:
        raise AttnkitError(
            "this marian model shares its encoder and decoder embeddings but not its output "
            "projection, which attnkit cannot express; set tie_word_embeddings to true"
        )
    src_vocab = hf.get("vocab_size", 58101)
    vocab = src_vocab if share else hf.get("decoder_vocab_size") or src_vocab
    return ModelConfig(
        shape="encoder-decoder",
        vocab_size=vocab,
        src_vocab_size=src_vocab,
        d_model=hf.get("d_model", 1024),
        n_heads=hf.get("encoder_attention_heads", 16),
        n_encoder_layers=hf.get("encoder_layers", 12),
        n_decoder_layers=hf.get("decoder_layers", 12),
        d_ff=hf.get("encoder_ffn_dim", 4096),
        dropout=hf.get("dropout", 0.1),
        attention_dropout=hf.get("attention_dropout", 0.0),
        activation_dropout=hf.get("activation_dropout", 0.0),
        embedding_dropout=hf.get("dropout", 0.1),
        activation=activation_from_hf(hf.get("activation_function", "gelu")),
        norm_position="post",
        # Marian's LayerNorms keep torch's default eps.
        norm_eps=1e-5,
        positional="sinusoidal",
        sinusoidal_layout="split",
        max_len=hf.get("max_position_embeddings", 1024),
        scale_embeddings=hf.get("scale_embedding", False),
        tie_embeddings="all" if share else ("decoder" if tied else "none"),
        pad_id=special_id(hf, "pad_token_id", vocab) or 0,
        logits_bias=True,
        decoder_start_id=special_id(hf, "decoder_start_token_id", vocab),
        eos_id=special_id(hf, "eos_token_id", vocab),
    )


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
    return {
        "vocab_size": c.src_vocab_size,
        "decoder_vocab_size": c.vocab_size,
        "share_encoder_decoder_embeddings": c.tie_embeddings == "all",
        "tie_word_embeddings": c.tie_embeddings != "none",
        "d_model": c.d_model,
        "encoder_attention_heads": c.n_heads,
        "decoder_attention_heads": c.n_heads,
        "encoder_layers": c.n_encoder_layers,
        "decoder_layers": c.n_decoder_layers,
        "encoder_ffn_dim": c.d_ff,
        "decoder_ffn_dim": c.d_ff,
        "dropout": c.dropout,
        "attention_dropout": c.attention_dropout,
        "activation_dropout": c.activation_dropout,
        "activation_function": activation_to_hf(c.activation),
        "max_position_embeddings": c.max_len,
        "scale_embedding": c.scale_embeddings,
        "pad_token_id": c.pad_id,
        "decoder_start_token_id": c.decoder_start_id,
        "eos_token_id": c.eos_id,
        # As OPUS-MT models do: generation that reaches max_length ends with EOS.
        "forced_eos_token_id": c.eos_id,
        "is_encoder_decoder": True,
    }


def _layer(ours: str, theirs: str, cross: bool) -> list[Rule]:
    def qkv(prefix: str, names: str) -> tuple[str, ...]:
        return tuple(f"{theirs}.{prefix}.{n}_proj" for n in names)

    out = [
        *module(f"{ours}.self_attn.qkv_proj", qkv("self_attn", "qkv"), "concat"),
        *module(f"{ours}.self_attn.out_proj", f"{theirs}.self_attn.out_proj"),
        *module(f"{ours}.self_attn_residual.norm", f"{theirs}.self_attn_layer_norm"),
        *module(f"{ours}.ff.w_1", f"{theirs}.fc1"),
        *module(f"{ours}.ff.w_2", f"{theirs}.fc2"),
        *module(f"{ours}.ff_residual.norm", f"{theirs}.final_layer_norm"),
    ]
    if cross:
        out += [
            *module(f"{ours}.cross_attn.q_proj", f"{theirs}.encoder_attn.q_proj"),
            *module(f"{ours}.cross_attn.kv_proj", qkv("encoder_attn", "kv"), "concat"),
            *module(f"{ours}.cross_attn.out_proj", f"{theirs}.encoder_attn.out_proj"),
            *module(f"{ours}.cross_attn_residual.norm", f"{theirs}.encoder_attn_layer_norm"),
        ]
    return out


def _embeddings(c: ModelConfig) -> list[Rule]:
    encoder, decoder = "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"
    if c.tie_embeddings == "all":
        tied = (encoder, decoder, "lm_head.weight")
        return [Rule("src_embed.token.weight", ("model.shared.weight",), aliases=tied)]
    out = [Rule("src_embed.token.weight", (encoder,))]
    if c.tie_embeddings == "decoder":
        return [*out, Rule("tgt_embed.token.weight", (decoder,), aliases=("lm_head.weight",))]
    return [
        *out,
        Rule("tgt_embed.token.weight", (decoder,)),
        Rule("head.weight", ("lm_head.weight",)),
    ]


def rules(c: ModelConfig) -> list[Rule]:
    out = [
        *_embeddings(c),
        # MarianModel (no head) has no bias; MarianMTModel starts it at zero, as attnkit does.
        Rule("head.bias", ("final_logits_bias",), "row", optional=True),
    ]
    for side in ("encoder", "decoder"):
        # Older checkpoints store the sinusoidal tables; they must be the ones attnkit computes.
        embed = "src_embed" if side == "encoder" else "tgt_embed"
        out.append(
            Rule(
                f"{embed}.positions.table",
                (f"model.{side}.embed_positions.weight",),
                "fixed",
                optional=True,
            )
        )
        n_layers = c.n_encoder_layers if side == "encoder" else c.n_decoder_layers
        for i in range(n_layers):
            out += _layer(f"{side}.blocks.{i}", f"model.{side}.layers.{i}", side == "decoder")
    return out


MARIAN = Family(
    model_type="marian",
    architecture="MarianMTModel",
    shape="encoder-decoder",
    prefix="model.",
    prefixed=True,
    top_level=frozenset({"final_logits_bias", "lm_head.weight"}),
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    rules=rules,
)
