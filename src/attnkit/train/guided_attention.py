"""Guided attention: a loss that keeps cross-attention near the diagonal (monotonic tasks).

Where input and output are aligned in order (grapheme-to-phoneme, speech),
target position t should attend to a source position n with n/N close to
t/T. Tachibana et al. (2017, DCTTS) add to the training loss

    L_att = mean_{n,t} (A_nt W_nt),    W_nt = 1 - exp(-(n/N - t/T)^2 / (2 g^2))

where A is the cross-attention of query t over key n, g the width of the
band of no penalty around the diagonal. Here, for each pair of a batch:

- N is the source's real length, its </s> included (a key the decoder can
  attend to); T is the number of decoder queries that predict a token, from
  the one reading <s> (predicting y_1) to the one predicting </s>. Padding
  (and the decoder input after </s>, which predicts nothing) is neither in W
  nor in the mean. The last query predicts </s> and is matched to the
  source's </s>: both ends of the diagonal are real tokens.
- Positions are normalised at the centre of each token's share of [0, 1]:
  n/N and t/T above are (n + 1/2)/N and (t + 1/2)/T with n, t counted from 0
  over real tokens. It is the paper's n/N, t/T moved half a token, so the
  first and last tokens sit symmetrically off the ends and a one-token
  sequence is defined; the diagonal (n + 1/2)/N = (t + 1/2)/T is where W = 0.
- The mean is over the N * T real cells of each pair, then over the pairs of
  the batch: each pair's loss is the paper's. (ESPnet pools the cells of the
  whole batch instead, which weighs long pairs more.) A row of A sums to 1,
  so L_att <= 1/N: it asks less of each cell of a long source.
- A is averaged over the chosen heads and layers first (L_att is linear in A).

Defaults (the [guided_attention] section): `weight` 0 is off. The paper adds
L_att to its other losses with weight 1, as ESPnet's Transformer-TTS does;
the trainer adds weight * L_att to the token-mean cross-entropy of the step,
and a uniform attention costs about L_att = mean(W) / N (about 0.06 for a
10-token source at g = 0.2), against a cross-entropy that falls from ln(V)
to well under 1, so 1.0 is a sensible start. `width` g = 0.2 is the paper's
(ESPnet uses 0.4, a looser band). `layers` defaults to the last decoder
layer: it is the attention that the monotonic decoding constraint
(`GenerationConfig.monotonic_window`) reads to move its focus and that a
copy attention reads, so training shapes what decoding relies on, while the
lower layers stay free to gather context (ESPnet likewise guides only the
last layers, two of them, two heads each); "all" guides every layer.
`heads` defaults to all of them; Rios et al. (2021) found that biasing every
head of a Transformer towards monotonic attention did not help it, while
biasing a few heads sometimes did, so `heads = "0"` is worth a try.

The loss is a training term only: in evaluation the objective is plain
cross-entropy, so validation losses compare with runs without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.checks import check, finite_fields, non_negative, positive
from attnkit.data.batch import Batch
from attnkit.errors import AttnkitError
from attnkit.models.base import unwrap
from attnkit.train.cross_entropy import IGNORE, LossTerms
from attnkit.train.objectives import Objective, TranslationObjective

# The words `layers` and `heads` accept besides indices.
LAYER_WORDS = ("all", "last")
HEAD_WORDS = ("all",)


@dataclass(frozen=True)
class GuidedAttentionSection:
    """The [guided_attention] section of a run config; `weight = 0` (the default) is off.

    weight: lambda of lambda * L_att, added to the token-mean cross-entropy of each step.
    width: g, the width of the diagonal band (in normalised positions) left unpenalised.
    layers: the decoder layers whose cross-attention is guided: "last" (the default),
        "all", one index (0 is the first, -1 the last) or indices in a string, "0,2".
    heads: the heads guided in each of those layers: "all" (the default), one index
        or indices in a string, "0,1".
    """

    weight: float = 0.0
    width: float = 0.2
    layers: int | str = "last"
    heads: int | str = "all"

    def __post_init__(self) -> None:
        s = "guided_attention"
        finite_fields(self, s)
        non_negative(f"{s}.weight", self.weight)
        positive(f"{s}.width", self.width)
        _parse(f"{s}.layers", self.layers, LAYER_WORDS)
        _parse(f"{s}.heads", self.heads, HEAD_WORDS)

    @property
    def on(self) -> bool:
        return self.weight > 0

    def layer_indices(self, n_layers: int) -> tuple[int, ...]:
        """The guided decoder layers of a decoder of `n_layers`, counted from 0, in order."""
        name = "guided_attention.layers"
        return _indices(name, self.layers, LAYER_WORDS, n_layers, "model.n_decoder_layers")

    def head_indices(self, n_heads: int) -> tuple[int, ...]:
        """The guided heads of each guided layer, of `n_heads`, counted from 0, in order."""
        return _indices("guided_attention.heads", self.heads, HEAD_WORDS, n_heads, "model.n_heads")


def _parse(name: str, value: int | str, words: tuple[str, ...]) -> str | list[int]:
    """A word of `words`, or the indices that `value` lists (an int or "0, 2")."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, str) and value.strip() in words:
        return value.strip()
    try:
        indices = [int(part) for part in str(value).split(",")]
    except ValueError:
        raise AttnkitError(
            f"{name} must be {' or '.join(repr(w) for w in words)}, an index or indices "
            f"separated by commas such as '0,2'; got {value!r}"
        ) from None
    duplicate = next((i for i in indices if indices.count(i) > 1), None)
    check(duplicate is None, f"{name} names {duplicate} twice; name each index once")
    return indices


def _indices(
    name: str, value: int | str, words: tuple[str, ...], n: int, size_key: str
) -> tuple[int, ...]:
    """The indices `value` names among n (a model's layers or heads), negative ones counted
    from the end; `size_key` is the model field that n comes from."""
    parsed = _parse(name, value, words)
    if parsed == "all":
        return tuple(range(n))
    if parsed == "last":
        return (n - 1,)
    for i in parsed:
        check(
            -n <= i < n,
            f"{name} {i} is out of range for {size_key} = {n}; use 0 to {n - 1}, "
            f"or -{n} to -1 counting from the end",
        )
    resolved = sorted(i % n for i in parsed)
    same = next((i for i in resolved if resolved.count(i) > 1), None)
    check(same is None, f"{name} names index {same} twice (once from the end); name it once")
    return tuple(resolved)


def _centred_positions(mask: Tensor) -> Tensor:
    """(batch, length) (k + 1/2) / K of the k-th of K real tokens; padding gets any value."""
    count = mask.sum(-1, keepdim=True).clamp(min=1)
    index = mask.long().cumsum(-1) - 1
    return (index + 0.5) / count


def guide_weights(query_mask: Tensor, key_mask: Tensor, width: float) -> Tensor:
    """W (batch, T, S) of each pair, from the masks (True for real) of its queries (batch, T)
    and keys (batch, S): 1 - exp(-(n/N - t/T)^2 / (2 g^2)) at real cells, 0 at padding."""
    query_mask, key_mask = query_mask.bool(), key_mask.bool()
    t = _centred_positions(query_mask)[:, :, None]
    n = _centred_positions(key_mask)[:, None, :]
    weights = 1 - torch.exp(-((n - t) ** 2) / (2 * width**2))
    return weights * (query_mask[:, :, None] & key_mask[:, None, :])


def guided_attention_loss(
    attention: Tensor, query_mask: Tensor, key_mask: Tensor, width: float
) -> Tensor:
    """L_att averaged over the pairs of a batch.

    attention: (batch, T, S), or (batch, ..., T, S) averaged over the middle dimensions
        (heads, layers); query_mask (batch, T) and key_mask (batch, S) are True for real.
    """
    attention = attention.float()
    if attention.dim() > 3:
        attention = attention.flatten(1, -3).mean(1)
    weights = guide_weights(query_mask, key_mask, width)
    cells = query_mask.sum(-1) * key_mask.sum(-1)
    per_pair = (attention * weights).sum((1, 2)) / cells.clamp(min=1)
    has_cells = cells > 0
    return per_pair[has_cells].sum() / has_cells.sum().clamp(min=1)


class GuidedAttention(Objective):
    """Wraps the translation objective: in training, adds weight * L_att to the step's loss.

    The model is asked for the cross-attention weights of the guided layers only
    (`cross_weights`); the others run fused. The term goes in `LossTerms.aux`
    (beside a mixture of experts' load-balancing loss, if any), times the
    step's tokens: the trainer divides by them, so each step minimises the
    token-mean cross-entropy plus weight * L_att, and records the sum of the
    two auxiliary terms as `train_aux_loss`.
    """

    def __init__(self, base: TranslationObjective, section: GuidedAttentionSection) -> None:
        super().__init__(base.label_smoothing)
        self.base, self.section = base, section
        self.task = base.task
        # What `predict` hands `__call__`: the guided layers' weights and the masks of a batch.
        self._guided: tuple[list[Tensor], Tensor, Tensor] | None = None

    def predict(self, model: nn.Module, batch: Batch) -> tuple[Tensor, Tensor]:
        dec_in, dec_mask, targets = self.base.teacher_forced(batch)
        if not model.training or not self.section.on:
            return self.base.run(model, batch, dec_in, dec_mask), targets
        layers = self.section.layer_indices(unwrap(model).config.n_decoder_layers)
        out = model(
            batch.src,
            dec_in,
            batch.src_mask,
            dec_mask,
            need_logits=False,
            cross_weights=layers,
        )
        keys = batch.src_mask
        if keys is None:
            keys = torch.ones_like(batch.src, dtype=torch.bool)
        self._guided = (out.attentions["cross"], targets != IGNORE, keys)
        return out.hidden, targets

    def __call__(self, model: nn.Module, batch: Batch) -> LossTerms:
        self._guided = None
        terms = super().__call__(model, batch)
        guided, self._guided = self._guided, None
        if guided is None:
            return terms
        weights, queries, keys = guided
        attention = self.attention(model, weights)
        loss = guided_attention_loss(attention, queries, keys, self.section.width)
        term = self.section.weight * loss * terms.tokens
        terms.aux = term if terms.aux is None else terms.aux + term
        return terms

    def attention(self, model: nn.Module, weights: list[Tensor]) -> Tensor:
        """A (batch, T, S): the guided layers' weights (batch, heads, T, S) averaged over the
        guided heads and layers."""
        n_heads = unwrap(model).config.n_heads
        heads = self.section.head_indices(n_heads)
        total = None
        for w in weights:
            if len(heads) < n_heads:
                w = w[:, list(heads)]
            mean = w.float().mean(1)
            total = mean if total is None else total + mean
        return total / len(weights)
