"""The encoder-decoder Transformer of the paper (figure 1), for translation.

    memory = Encoder(Embed_src(x))
    logits = Decoder(Embed_tgt(y_shifted), memory) W_out                     (section 3)

The decoder's self-attention is causal; its cross-attention reads the whole
memory except source padding. At inference the memory is computed once
(`new_cache` keeps its cross-attention keys and values) and the decoder runs
step by step on the cache (`decode_step`).
"""

from __future__ import annotations

from collections.abc import Collection

from torch import Tensor

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.models.base import Output, TransformerModel, bool_mask, collect
from attnkit.models.stack import Embed, Stack
from attnkit.nn import Linear, TokenEmbedding
from attnkit.nn.kv_cache import KVCache


class EncoderDecoder(TransformerModel):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.shape != "encoder-decoder":
            raise AttnkitError(
                f"EncoderDecoder needs an encoder-decoder config, got shape {config.shape!r}"
            )
        c = self.config = config
        tgt_token = TokenEmbedding(c.vocab_size, c.d_model, c.scale_embeddings)
        src_token = (
            tgt_token
            if c.tie_embeddings == "all"
            else TokenEmbedding(c.src_vocab_size, c.d_model, c.scale_embeddings)
        )
        self.src_embed = Embed(src_token, c)
        self.tgt_embed = Embed(tgt_token, c)
        self.encoder = Stack(c, c.n_encoder_layers, causal=False, cross=False)
        self.decoder = Stack(c, c.n_decoder_layers, causal=True, cross=True)
        self.head = Linear(c.d_model, c.vocab_size, bias=c.logits_bias)
        self._init_weights()
        if c.tie_embeddings != "none":
            self.head.weight = tgt_token.weight

    def _encode(self, src_ids: Tensor, src_mask: Tensor | None, need_weights: bool):
        src_mask = self._check(src_ids, src_mask, "src_ids")
        positions = self.positions_from_mask(src_mask)
        x = self.src_embed(src_ids, positions)
        memory, weights = self.encoder(x, src_mask, positions=positions, need_weights=need_weights)
        return memory, src_mask, weights

    def _decode(self, tgt_ids, memory, src_mask, tgt_mask, need_weights, cross_weights=()):
        tgt_mask = self._check(tgt_ids, tgt_mask, "tgt_ids")
        if tgt_ids.shape[0] != memory.shape[0]:
            # Attention would broadcast one row over the other batch, or fail deep inside it.
            raise AttnkitError(
                f"tgt_ids is a batch of {tgt_ids.shape[0]} but the source a batch of "
                f"{memory.shape[0]}; give one target sequence per source sequence"
            )
        positions = self.positions_from_mask(tgt_mask)
        y = self.tgt_embed(tgt_ids, positions)
        return self.decoder(
            y,
            tgt_mask,
            memory=memory,
            memory_key_mask=src_mask,
            positions=positions,
            need_weights=need_weights,
            cross_weights=cross_weights,
        )

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Source ids (batch, S) -> memory (batch, S, d_model)."""
        return self._encode(src_ids, src_mask, False)[0]

    def decode(
        self,
        tgt_ids: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        *,
        need_logits: bool = True,
    ) -> Tensor:
        """Target ids (batch, T), already shifted right, and memory -> logits (batch, T, vocab),
        or with `need_logits=False` the decoder's last hidden states (batch, T, d_model)."""
        if src_mask is not None:
            if src_mask.shape != memory.shape[:2]:
                raise AttnkitError(
                    f"src_mask has shape {tuple(src_mask.shape)} but the memory covers "
                    f"{tuple(memory.shape[:2])}; give the mask of the source that was encoded"
                )
            src_mask = bool_mask(src_mask, "src_ids")
        hidden = self._decode(tgt_ids, memory, src_mask, tgt_mask, False)[0]
        return self.head(hidden) if need_logits else hidden

    def new_cache(
        self, src_ids: Tensor, src_mask: Tensor | None = None, capacity: int | None = None
    ) -> KVCache:
        """Encode the source once and start a decoding cache with its cross-attention K, V.

        `capacity` is the most target positions to decode (default max_len).
        """
        memory, src_mask, _ = self._encode(src_ids, src_mask, False)
        cache = self._new_cache(src_ids.shape[0], capacity)
        cache.set_memory([b.cross_attn.memory_kv(memory) for b in self.decoder.blocks], src_mask)
        return cache

    def decode_step(self, ids: Tensor, cache: KVCache, mask: Tensor | None = None) -> Tensor:
        """Next target ids (batch, n) on the cache -> logits (batch, vocab) after the last one."""
        return self._step(self.tgt_embed, ids, cache, mask)

    def forward(
        self,
        src_ids: Tensor,
        tgt_ids: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        need_logits: bool = True,
        cross_weights: Collection[int] = (),
    ) -> Output:
        """Teacher-forced pass: logits for every target position.

        Masks are (batch, length), True (or 1) for real tokens, None for no padding.
        `need_weights` returns every attention's weights; `cross_weights` only the
        cross-attention weights of the decoder layers it lists (under "cross").
        """
        memory, src_mask, enc_w = self._encode(src_ids, src_mask, need_weights)
        hidden, dec_w = self._decode(
            tgt_ids, memory, src_mask, tgt_mask, need_weights, cross_weights
        )
        attentions = None
        if need_weights:
            attentions = {
                "encoder": collect(enc_w, 0),
                "decoder": collect(dec_w, 0),
                "cross": collect(dec_w, 1),
            }
        elif cross_weights:
            attentions = {"cross": collect(dec_w, 1)}
        return self._output(hidden, attentions, need_logits)
