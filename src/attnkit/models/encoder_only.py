"""The encoder-only Transformer (BERT): a bidirectional sentence encoder.

    hidden = Stack(Embed(x));  logits = hidden W_out  (masked-token prediction)

Every position attends to every real position; `hidden` gives token vectors
to pool into sentence embeddings.
"""

from __future__ import annotations

from torch import Tensor

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.models.base import Output, TransformerModel, collect
from attnkit.models.stack import Embed, Stack
from attnkit.nn import Linear, TokenEmbedding


class EncoderOnly(TransformerModel):
    """A bidirectional encoder over one vocabulary (BERT, all-MiniLM-L6-v2).

    embed: token embedding, absolute positions, token types and a norm where the
        config asks for them; encoder: a non-causal `Stack`; head: the output projection
        to the vocabulary (masked-token prediction), tied to the embedding with
        `tie_embeddings = "decoder"`.

    `forward(ids, mask)` gives every position's hidden state and logits; padding keys are
    never attended. Sentence embeddings pool the hidden states (`attnkit.pooling`).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.shape != "encoder":
            raise AttnkitError(f"EncoderOnly needs an encoder config, got shape {config.shape!r}")
        c = self.config = config
        token = TokenEmbedding(c.vocab_size, c.d_model, c.scale_embeddings)
        self.embed = Embed(token, c)
        self.encoder = Stack(c, c.n_encoder_layers, causal=False, cross=False)
        self.head = Linear(c.d_model, c.vocab_size, bias=c.logits_bias)
        self._init_weights()
        if c.tie_embeddings == "decoder":
            self.head.weight = token.weight

    def forward(
        self,
        ids: Tensor,
        mask: Tensor | None = None,
        *,
        token_types: Tensor | None = None,
        need_weights: bool = False,
        need_logits: bool = True,
    ) -> Output:
        """ids (batch, length) -> per-token logits and hidden states.

        `token_types` (batch, length), for a model with `n_token_types`, say
        which segment each token belongs to (BERT's sentence A = 0, B = 1).
        """
        mask = self._check(ids, mask, "ids")
        positions = self.positions_from_mask(mask)
        x = self.embed(ids, positions, token_types)
        hidden, weights = self.encoder(x, mask, positions=positions, need_weights=need_weights)
        attentions = {"encoder": collect(weights, 0)} if need_weights else None
        return self._output(hidden, attentions, need_logits)
