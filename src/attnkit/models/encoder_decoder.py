"""The encoder-decoder Transformer of the paper (figure 1), for translation.

    memory = Encoder(Embed_src(x))
    logits = Decoder(Embed_tgt(y_shifted), memory) W_out                     (section 3)

The decoder's self-attention is causal; its cross-attention reads the whole
memory except source padding. At inference the memory is computed once
(`new_cache` keeps its cross-attention keys and values in a `DecodingState`)
and the decoder runs step by step on it (`decode_step`).

With `copy_attention` the output is a pointer-generator's (`nn/copy.py`): the
"logits" are log P(w) over the vocabulary extended by the source's unknown
words, whose softmax is P itself, so greedy search, beam search and sampling
(temperature, top-k, top-p) read them as they read logits. A processor that
reads the scale of logits, the repetition penalty, then acts on
log-probabilities, as it does in beam search for every model.
"""

from __future__ import annotations

from collections.abc import Collection

from torch import Tensor

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.models.base import Output, TransformerModel, bool_mask, collect
from attnkit.models.block import Weights
from attnkit.models.decoding_state import CopySource, DecodingState
from attnkit.models.stack import Embed, Stack
from attnkit.nn import Linear, TokenEmbedding
from attnkit.nn.alignment_attention import AlignmentAttention
from attnkit.nn.alignment_state import AlignmentState
from attnkit.nn.copy import PointerGenerator


class EncoderDecoder(TransformerModel):
    """The paper's model: an encoder over the source, a decoder over the target that attends
    to the encoder's output (figure 1).

    src_embed, tgt_embed: each side's token embedding and positions, one table for both
        with `tie_embeddings = "all"`; encoder: a non-causal `Stack`; decoder: a causal
        `Stack` with cross-attention; head: the output projection (tied to the target
        embedding unless `tie_embeddings = "none"`); copy: the pointer-generator with
        `copy_attention` (`nn/copy.py`), else None.

    `forward(src, tgt)` is the teacher-forced pass; `encode` and `decode` are its halves.
    For generation `new_cache` encodes the source once into a `DecodingState` and
    `decode_step` runs the decoder a step at a time on it.
    """

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
            if c.tie_embeddings in ("all", "inputs")
            else TokenEmbedding(c.src_vocab_size, c.d_model, c.scale_embeddings)
        )
        self.src_embed = Embed(src_token, c)
        self.tgt_embed = Embed(tgt_token, c)
        self.encoder = Stack(c, c.n_encoder_layers, causal=False, cross=False)
        self.decoder = Stack(c, c.n_decoder_layers, causal=True, cross=True)
        self.head = Linear(c.d_model, c.vocab_size, bias=c.logits_bias)
        self.copy = None
        if c.copy_attention != "none":
            self.copy = PointerGenerator(c.d_model, c.vocab_size, c.unk_id, c.copy_attention)
        self._init_weights()
        if c.tie_embeddings in ("decoder", "all"):
            self.head.weight = tgt_token.weight

    @property
    def copy_layer(self) -> tuple[int, ...]:
        """The decoder layer whose cross-attention the pointer copies through (the last)."""
        return () if self.copy is None else (self.config.n_decoder_layers - 1,)

    def _in_vocab(self, ids: Tensor) -> Tensor:
        return ids if self.copy is None else self.copy.in_vocab(ids)

    def _encode(self, src_ids: Tensor, src_mask: Tensor | None, need_weights: bool):
        src_mask = self._check(src_ids, src_mask, "src_ids")
        positions = self.positions_from_mask(src_mask)
        x = self.src_embed(self._in_vocab(src_ids), positions)
        memory, weights = self.encoder(x, src_mask, positions=positions, need_weights=need_weights)
        return memory, src_mask, weights

    def _decode(
        self,
        tgt_ids: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        need_weights: bool,
        cross_weights: Collection[int] = (),
    ) -> tuple[Tensor, list[Weights]]:
        tgt_mask = self._check(tgt_ids, tgt_mask, "tgt_ids")
        if tgt_ids.shape[0] != memory.shape[0]:
            # Attention would broadcast one row over the other batch, or fail deep inside it.
            raise AttnkitError(
                f"tgt_ids is a batch of {tgt_ids.shape[0]} but the source a batch of "
                f"{memory.shape[0]}; give one target sequence per source sequence"
            )
        positions = self.positions_from_mask(tgt_mask)
        y = self.tgt_embed(self._in_vocab(tgt_ids), positions)
        return self.decoder(
            y,
            tgt_mask,
            memory=memory,
            memory_key_mask=src_mask,
            positions=positions,
            need_weights=need_weights,
            cross_weights={*cross_weights, *self.copy_layer},
        )

    def _copy_output(
        self,
        hidden: Tensor,
        tgt_ids: Tensor,
        weights: list[Weights],
        memory: Tensor,
        src_ids: Tensor,
    ) -> Tensor:
        """The pointer-generator's log P (batch, T, V + extra) at the positions of `hidden`."""
        inputs = self.tgt_embed.token(self._in_vocab(tgt_ids))
        copy_weights = weights[-1][1]
        return self.copy(self.head(hidden), hidden, inputs, copy_weights, memory, src_ids)

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
        src_ids: Tensor | None = None,
    ) -> Tensor:
        """Target ids (batch, T), already shifted right, and memory -> logits (batch, T, vocab),
        or with `need_logits=False` the decoder's last hidden states (batch, T, d_model).

        A pointer-generator also needs the `src_ids` the memory encodes, to copy from.
        """
        if src_mask is not None:
            if src_mask.shape != memory.shape[:2]:
                raise AttnkitError(
                    f"src_mask has shape {tuple(src_mask.shape)} but the memory covers "
                    f"{tuple(memory.shape[:2])}; give the mask of the source that was encoded"
                )
            src_mask = bool_mask(src_mask, "src_ids")
        hidden, weights = self._decode(tgt_ids, memory, src_mask, tgt_mask, False)
        if not need_logits:
            return hidden
        if self.copy is None:
            return self.head(hidden)
        if src_ids is None:
            raise AttnkitError(
                "this model copies from its source (copy_attention), so decode needs src_ids"
            )
        return self._copy_output(hidden, tgt_ids, weights, memory, src_ids)

    def new_cache(
        self, src_ids: Tensor, src_mask: Tensor | None = None, capacity: int | None = None
    ) -> DecodingState:
        """Encode the source once and start a decode: a cache holding its cross-attention K, V
        (and, for a pointer-generator, what it copies from; for location-aware or monotonic
        attention, where their alignments are carried).

        `capacity` is the most target positions to decode (default max_len).
        """
        memory, src_mask, _ = self._encode(src_ids, src_mask, False)
        kv = self._new_cache(src_ids.shape[0], capacity)
        kv.set_memory([b.cross_attn.memory_kv(memory) for b in self.decoder.blocks], src_mask)
        source = None if self.copy is None else CopySource(memory, src_ids)
        aligning = any(isinstance(b.cross_attn, AlignmentAttention) for b in self.decoder.blocks)
        return DecodingState(kv, source, AlignmentState() if aligning else None)

    def decode_step(self, ids: Tensor, cache: DecodingState, mask: Tensor | None = None) -> Tensor:
        """Next target ids (batch, n) on the cache -> logits (batch, vocab) after the last one.

        With a monotonic window (`DecodingState.set_monotonic`) every layer attends within
        it, and the last layer's cross-attention then moves its focus.
        """
        window = cache.window
        last = (self.config.n_decoder_layers - 1,)  # the copy layer, and the window's
        hidden, weights = self._step_hidden(
            self.tgt_embed,
            self._in_vocab(ids),
            cache.kv_cache,
            mask,
            last if self.copy is not None or window is not None else (),
            None if window is None else window.keys(),
            alignment=cache.alignment,
        )
        if window is not None:
            window.move(weights[-1][1])
        if self.copy is None:
            return self.head(hidden[:, -1])
        asked = [(None, w[1][:, :, -1:]) for w in weights if w[1] is not None]
        memory, src_ids = cache.source
        return self._copy_output(hidden[:, -1:], ids[:, -1:], asked, memory, src_ids)[:, 0]

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
            asked = [w for i, w in enumerate(dec_w) if i in cross_weights]
            attentions = {"cross": collect(asked, 1)}
        if self.copy is None or not need_logits:
            return self._output(hidden, attentions, need_logits)
        log_p = self._copy_output(hidden, tgt_ids, dec_w, memory, src_ids)
        return Output(log_p, hidden, attentions)
