"""Scheduled sampling: train the decoder on some of its own predictions (exposure bias).

Teacher forcing trains the decoder on the gold prefix y_<t, but at inference it
reads its own predictions, which it has never seen in training. Scheduled
sampling (Bengio et al., 2015) replaces each gold input token by the model's
prediction with probability 1 - eps_i, where the gold-token probability eps_i
decays with the training step i:

    constant          eps_i = k
    linear            eps_i = max(min_gold, k - slope * i)
    exponential       eps_i = max(min_gold, k^i)                 (k < 1)
    inverse-sigmoid   eps_i = max(min_gold, k / (k + exp(i / k)))  (k >= 1)

Bengio et al. decode step by step, which a Transformer cannot afford. Mihaylova
& Martins (2019) use two passes instead: a first pass reads the gold prefix and
predicts every position at once; a second pass reads, at each position t >= 1,
the gold token y_t with probability eps_i or else the first pass's prediction
for that position, and is trained with the usual cross-entropy on the gold
targets. The prediction mixed in is

    argmax            the most likely token
    sample            a token drawn from softmax(z / temperature)
    softmax           the expected embedding sum_v p_v E_v under softmax(z / temperature),
                      over the `top_k` most likely tokens if top_k > 0 (their "top-k")

The first pass runs without gradient unless `first_pass_grad` (which only a
softmax mix can use: tokens carry no gradient). With `passes` > 1, each pass
mixes the gold tokens with the previous pass's predictions, as in Parallel
Scheduled Sampling (Duckworth et al., 2019); the loss is the last pass's. In
evaluation the objective is plain teacher forcing, so validation losses compare.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.checks import check, choice, finite_fields, non_negative, positive, within
from attnkit.data.batch import Batch
from attnkit.models.base import unwrap
from attnkit.nn.embedding import TokenEmbedding
from attnkit.train.objectives import NextTokenObjective, Objective

DECAYS = ("off", "constant", "linear", "exponential", "inverse-sigmoid")
MIXES = ("argmax", "sample", "softmax")


@dataclass(frozen=True)
class ScheduledSamplingSection:
    """The [scheduled_sampling] section of a run config; `decay = "off"` (the default) is
    plain teacher forcing.

    decay, k, slope, min_gold: the gold-token probability eps_i by step (see the module).
    mix: what replaces a gold token: `argmax`, `sample` or `softmax` (embeddings).
    temperature: of the softmax that `sample` draws from and `softmax` weights by.
    top_k: `softmax` mixes the k most likely tokens only; 0 mixes the whole vocabulary.
    first_pass_grad: backpropagate through the first pass too (`softmax` only).
    passes: predicting passes before the trained one (Parallel Scheduled Sampling if > 1).
    """

    decay: str = "off"
    k: float = 1.0
    slope: float = 0.0
    min_gold: float = 0.0
    mix: str = "argmax"
    temperature: float = 1.0
    top_k: int = 0
    first_pass_grad: bool = False
    passes: int = 1

    def __post_init__(self) -> None:
        s = "scheduled_sampling"
        finite_fields(self, s)
        choice(f"{s}.decay", self.decay, DECAYS)
        choice(f"{s}.mix", self.mix, MIXES)
        within(f"{s}.min_gold", self.min_gold, "[0, 1]")
        non_negative(f"{s}.slope", self.slope)
        non_negative(f"{s}.top_k", self.top_k)
        positive(f"{s}.temperature", self.temperature)
        positive(f"{s}.passes", self.passes)
        ranges = {
            "constant": (0 <= self.k <= 1, "0 <= k <= 1, the gold-token probability"),
            "linear": (0 < self.k <= 1, "0 < k <= 1, the probability at step 0"),
            "exponential": (0 < self.k < 1, "0 < k < 1, the base of k^i"),
            "inverse-sigmoid": (self.k >= 1, "k >= 1, as in k / (k + exp(i / k))"),
        }
        if self.decay in ranges:
            ok, rule = ranges[self.decay]
            check(ok, f"{s}.decay {self.decay!r} needs {rule}; got {s}.k = {self.k}")
        check(
            self.decay != "linear" or self.slope > 0,
            f"{s}.decay 'linear' needs {s}.slope > 0, the drop per step",
        )
        check(
            not self.first_pass_grad or self.mix == "softmax",
            f"{s}.first_pass_grad needs {s}.mix = 'softmax': argmax and sampled tokens "
            "pass no gradient back to the first pass",
        )
        check(
            self.top_k == 0 or self.mix == "softmax",
            f"{s}.top_k applies to {s}.mix = 'softmax' only; set it to 0",
        )

    @property
    def on(self) -> bool:
        return self.decay != "off"


def gold_probability(section: ScheduledSamplingSection, step: int) -> float:
    """eps_i, the probability that the decoder reads the gold token at training step `step`."""
    k, decay = section.k, section.decay
    if decay == "off":
        return 1.0
    if decay == "constant":
        return k
    if decay == "linear":
        eps = k - section.slope * step
    elif decay == "exponential":
        eps = k**step
    else:  # inverse sigmoid; exp(i / k) overflows for large i, where eps is 0 anyway
        eps = k / (k + math.exp(min(step / k, 700.0)))
    return max(section.min_gold, eps)


def choose_positions(
    mask: Tensor | None, shape: torch.Size, gold: float, device: torch.device
) -> Tensor:
    """(batch, length) True where the model's prediction replaces the gold input: each real
    position t >= 1 with probability 1 - gold (position 0 reads the start token)."""
    chosen = torch.rand(shape, device=device) >= gold
    chosen[:, 0] = False
    return chosen if mask is None else chosen & mask.bool()


def mix_inputs(gold: Tensor, predicted: Tensor, chosen: Tensor) -> Tensor:
    """The decoder inputs: `predicted[:, t - 1]` (the prediction of token t) where `chosen`,
    the gold token elsewhere."""
    shifted = torch.cat([gold[:, :1], predicted[:, :-1]], dim=1)
    return torch.where(chosen, shifted, gold)


class ScheduledSampling(Objective):
    """Wraps a next-token objective (translation, language model) with scheduled sampling."""

    def __init__(self, base: NextTokenObjective, section: ScheduledSamplingSection) -> None:
        super().__init__(base.label_smoothing)
        self.base, self.section = base, section
        self.task = base.task
        self.one_forward = not section.first_pass_grad

    def predict(self, model: nn.Module, batch: Batch) -> tuple[Tensor, Tensor]:
        dec_in, dec_mask, targets = self.base.teacher_forced(batch)
        gold = gold_probability(self.section, self.step)
        if not model.training or gold >= 1.0:
            return self.base.run(model, batch, dec_in, dec_mask), targets
        s = self.section
        plain = unwrap(model)
        token = _target_embedding(plain)
        inputs, soft = dec_in, None
        for _ in range(s.passes):
            with torch.set_grad_enabled(s.first_pass_grad and torch.is_grad_enabled()):
                with _soft_inputs(token, inputs, soft):
                    hidden = self.base.run(model, batch, inputs, dec_mask)
                logits = plain.head(hidden).float() / s.temperature
            chosen = choose_positions(dec_mask, dec_in.shape, gold, dec_in.device)
            if s.mix == "sample":
                drawn = torch.multinomial(logits.softmax(-1).flatten(0, 1), 1)
                predicted = drawn.view(dec_in.shape)
            else:
                predicted = logits.argmax(-1)
            inputs = mix_inputs(dec_in, predicted, chosen)
            if s.mix == "softmax":
                soft = SoftInputs(logits, chosen, s.top_k)
        with _soft_inputs(token, inputs, soft):
            hidden = self.base.run(model, batch, inputs, dec_mask)
        return hidden, targets


@dataclass
class SoftInputs:
    """Expected embeddings of the first pass's distributions, read where `chosen`."""

    logits: Tensor  # (batch, length, vocab) of the pass that predicts; row t predicts t + 1
    chosen: Tensor  # (batch, length) the decoder positions that read a prediction
    top_k: int

    def embed(self, token: TokenEmbedding) -> Tensor:
        """(chosen positions, d_model): sum_v p_v E_v * scale, for the prediction of each."""
        logits = torch.cat([self.logits[:, :1], self.logits[:, :-1]], dim=1)  # of position t
        logits = logits[self.chosen]  # the mixture costs a product with E: only where read
        weight = token.weight
        if self.top_k:
            top, ids = logits.topk(self.top_k, dim=-1)
            p = top.softmax(-1).to(weight.dtype)
            mixed = (p.unsqueeze(-1) * weight[ids]).sum(-2)
        else:
            mixed = logits.softmax(-1).to(weight.dtype) @ weight
        return mixed * token.scale


@contextlib.contextmanager
def _soft_inputs(token: TokenEmbedding, ids: Tensor, soft: SoftInputs | None) -> Iterator[None]:
    """While inside, the lookup of exactly the tensor `ids` (the decoder's inputs; a tied
    encoder embedding reads other ids) returns the expected embeddings where chosen."""
    if soft is None:
        yield
        return

    def replace(module: nn.Module, args: tuple, out: Tensor) -> Tensor | None:
        if args[0] is not ids:
            return None
        return out.masked_scatter(soft.chosen.unsqueeze(-1), soft.embed(token).to(out.dtype))

    handle = token.register_forward_hook(replace)
    try:
        yield
    finally:
        handle.remove()


def _target_embedding(model: nn.Module) -> TokenEmbedding:
    """The token embedding the decoder reads: an encoder-decoder's target side, or the one."""
    embed = model.tgt_embed if hasattr(model, "tgt_embed") else model.embed
    return embed.token
