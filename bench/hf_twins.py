"""Twin models: an attnkit model and a Hugging Face one with the same weights.

Used by the decoding benchmark (and its parity tests) so both sides decode
identical tokens. GPT-2 shapes map to `DecoderOnly` (pre-LN, learned
positions, tied head); Marian shapes to `EncoderDecoder` (post-LN, sinusoidal
positions in Marian's layout, copied over, scaled and tied embeddings).
"""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel, MarianConfig, MarianMTModel

from attnkit import DecoderOnly, EncoderDecoder, ModelConfig


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"shape mismatch {tuple(dst.shape)} <- {tuple(src.shape)}")
    dst.copy_(src)


def _copy_linear(dst: torch.nn.Linear, weight: torch.Tensor, bias: torch.Tensor) -> None:
    _copy(dst.weight, weight)
    _copy(dst.bias, bias)


def _copy_norm(dst: torch.nn.LayerNorm, src: torch.nn.LayerNorm) -> None:
    _copy(dst.weight, src.weight)
    _copy(dst.bias, src.bias)


@torch.no_grad()
def gpt2_twins(
    n_layers: int, d_model: int, n_heads: int, vocab_size: int, max_len: int, seed: int = 0
) -> tuple[DecoderOnly, GPT2LMHeadModel]:
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
    ours = DecoderOnly(
        ModelConfig.from_preset(
            "gpt2-small",
            vocab_size=vocab_size,
            d_model=d_model,
            n_heads=n_heads,
            n_decoder_layers=n_layers,
            d_ff=4 * d_model,
            max_len=max_len,
            dropout=0.0,
            embedding_dropout=0.0,
        )
    ).eval()
    t = hf.transformer
    _copy(ours.embed.token.weight, t.wte.weight)
    _copy(ours.embed.positions.table, t.wpe.weight)
    for block, layer in zip(ours.decoder.blocks, t.h, strict=True):
        # GPT-2's Conv1D stores (in, out); nn.Linear stores (out, in).
        attn, mlp = layer.attn, layer.mlp
        _copy_linear(block.self_attn.qkv_proj, attn.c_attn.weight.T, attn.c_attn.bias)
        _copy_linear(block.self_attn.out_proj, attn.c_proj.weight.T, attn.c_proj.bias)
        _copy_linear(block.ff.w_1, mlp.c_fc.weight.T, mlp.c_fc.bias)
        _copy_linear(block.ff.w_2, mlp.c_proj.weight.T, mlp.c_proj.bias)
        _copy_norm(block.self_attn_residual.norm, layer.ln_1)
        _copy_norm(block.ff_residual.norm, layer.ln_2)
    _copy_norm(ours.decoder.norm, t.ln_f)
    return ours, hf


def _copy_attention(dst, src) -> None:
    """HF's separate q, k, v projections into attnkit's fused ones."""
    if dst.cross:
        _copy_linear(dst.q_proj, src.q_proj.weight, src.q_proj.bias)
        kv_w = torch.cat([src.k_proj.weight, src.v_proj.weight])
        kv_b = torch.cat([src.k_proj.bias, src.v_proj.bias])
        _copy_linear(dst.kv_proj, kv_w, kv_b)
    else:
        weight = torch.cat([src.q_proj.weight, src.k_proj.weight, src.v_proj.weight])
        bias = torch.cat([src.q_proj.bias, src.k_proj.bias, src.v_proj.bias])
        _copy_linear(dst.qkv_proj, weight, bias)
    _copy_linear(dst.out_proj, src.out_proj.weight, src.out_proj.bias)


@torch.no_grad()
def marian_twins(
    n_layers: int, d_model: int, n_heads: int, vocab_size: int, max_len: int, seed: int = 0
) -> tuple[EncoderDecoder, MarianMTModel]:
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
    ours = EncoderDecoder(
        ModelConfig(
            shape="encoder-decoder",
            vocab_size=vocab_size,
            d_model=d_model,
            n_heads=n_heads,
            n_encoder_layers=n_layers,
            n_decoder_layers=n_layers,
            d_ff=4 * d_model,
            dropout=0.0,
            embedding_dropout=0.0,
            max_len=max_len,
        )
    ).eval()
    m = hf.model
    _copy(ours.src_embed.token.weight, m.shared.weight)
    for embed, hf_stack in ((ours.src_embed, m.encoder), (ours.tgt_embed, m.decoder)):
        _copy(embed.positions.table, hf_stack.embed_positions.weight)
    for stack, hf_stack in ((ours.encoder, m.encoder), (ours.decoder, m.decoder)):
        for block, layer in zip(stack.blocks, hf_stack.layers, strict=True):
            _copy_attention(block.self_attn, layer.self_attn)
            _copy_norm(block.self_attn_residual.norm, layer.self_attn_layer_norm)
            if block.cross_attn is not None:
                _copy_attention(block.cross_attn, layer.encoder_attn)
                _copy_norm(block.cross_attn_residual.norm, layer.encoder_attn_layer_norm)
            _copy_linear(block.ff.w_1, layer.fc1.weight, layer.fc1.bias)
            _copy_linear(block.ff.w_2, layer.fc2.weight, layer.fc2.bias)
            _copy_norm(block.ff_residual.norm, layer.final_layer_norm)
    return ours, hf
