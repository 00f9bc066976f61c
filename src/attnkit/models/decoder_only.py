"""The decoder-only Transformer (GPT): a language model.

    logits = CausalStack(Embed(x)) W_out,  p(x_t | x_<t) = softmax(logits_{t-1})

The encoder-decoder's decoder without cross-attention.
"""

from __future__ import annotations

from torch import Tensor

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.models.base import Output, TransformerModel, collect
from attnkit.models.stack import Embed, Stack
from attnkit.nn import Linear, TokenEmbedding
from attnkit.nn.kv_cache import KVCache


class DecoderOnly(TransformerModel):
    """A causal language model over one vocabulary (GPT-2, Llama).

    embed: token embedding and absolute positions, where the config has them; decoder:
        a causal `Stack` without cross-attention; head: the output projection, tied to
        the embedding with `tie_embeddings = "decoder"`.

    `forward(ids, mask)` predicts every next token at once (teacher forcing); for
    generation, `new_cache` starts a `KVCache` for the prompts and `decode_step` runs new
    positions on it, one step's logits at a time.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.shape != "decoder":
            raise AttnkitError(f"DecoderOnly needs a decoder config, got shape {config.shape!r}")
        c = self.config = config
        token = TokenEmbedding(c.vocab_size, c.d_model, c.scale_embeddings)
        self.embed = Embed(token, c)
        self.decoder = Stack(c, c.n_decoder_layers, causal=True, cross=False)
        self.head = Linear(c.d_model, c.vocab_size, bias=c.logits_bias)
        self._init_weights()
        if c.tie_embeddings == "decoder":
            self.head.weight = token.weight

    def new_cache(
        self, ids: Tensor, mask: Tensor | None = None, capacity: int | None = None
    ) -> KVCache:
        """An empty decoding cache for the prompts `ids` (batch, length), fed by `decode_step`.

        `capacity` is the most positions, prompt included, to decode (default max_len).
        """
        self._check(ids, mask, "ids")
        return self._new_cache(ids.shape[0], capacity)

    def decode_step(self, ids: Tensor, cache: KVCache, mask: Tensor | None = None) -> Tensor:
        """Next ids (batch, n) on the cache -> logits (batch, vocab) after the last one.

        The first call usually feeds the whole (left-padded) prompt with its `mask`.
        """
        return self._step(self.embed, ids, cache, mask)

    def forward(
        self,
        ids: Tensor,
        mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        need_logits: bool = True,
    ) -> Output:
        """ids (batch, length) -> logits predicting each next token.

        `mask` (batch, length) is True for real tokens; left or right padding both work.
        """
        mask = self._check(ids, mask, "ids")
        positions = self.positions_from_mask(mask)
        x = self.embed(ids, positions)
        hidden, weights = self.decoder(x, mask, positions=positions, need_weights=need_weights)
        attentions = {"decoder": collect(weights, 0)} if need_weights else None
        return self._output(hidden, attentions, need_logits)
