"""Choosing each row's next token with its own request's parameters, and its log-probabilities.

For row r with logits z (the model's scores of the next token):

    z_v += logit_bias_v                                   (OpenAI's logit_bias)
    z_v  = z_v / rep if z_v > 0 else z_v * rep, v seen    (HF's repetition_penalty, prompt too)
    z_v -= c_v * frequency_penalty + [c_v > 0] * presence_penalty   (c_v: v's count in the output)
    logprobs = log_softmax(z)                             (what `logprobs` reports)
    y = argmax z                                          (temperature 0)
    y ~ softmax(warp(z, temperature, top_k, top_p))       (otherwise; `generation.warp`)

OpenAI defines the penalties over the tokens sampled so far, as here; the
log-probabilities are those of the model's distribution after bias and
penalties, before temperature and truncation. A row with a `seed` draws from a
generator of its own, seeded once, so its tokens do not depend on its companions
in the batch: the same draws as `generate(..., seed=seed)` alone.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnkit.generation import warp


@dataclass(frozen=True)
class Sampling:
    """How one output's tokens are chosen and when it ends.

    max_tokens: new tokens at most. temperature 0 is greedy. top_k 0 and top_p 1 are off.
    logit_bias: (token id, bias) pairs. stop: strings that end the output (left out of it).
    logprobs: alternatives to report with each token's log-probability; None reports none.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def adjusts(self) -> bool:
        """Whether the scores change before a token is chosen (bias or a penalty)."""
        return bool(
            self.logit_bias
            or self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
        )


@dataclass
class Row:
    """What choosing a row's next token reads: its parameters, prompt and output so far."""

    sampling: Sampling
    prompt: list[int]
    output: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if self.generator is None and self.sampling.seed is not None and not self.sampling.greedy:
            self.generator = torch.Generator().manual_seed(self.sampling.seed)


@dataclass(frozen=True)
class Choice:
    """A chosen token with its log-probability and the most likely alternatives."""

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


def choose(logits: Tensor, rows: list[Row]) -> list[Choice]:
    """Each row's next token from `logits` (rows, vocab), by its own `Sampling`."""
    scores = logits.float()
    adjusted = [i for i, row in enumerate(rows) if row.sampling.adjusts]
    if adjusted:
        scores = scores.clone()
        for i in adjusted:
            scores[i] = _adjust(scores[i], rows[i])
    tokens = torch.empty(len(rows), dtype=torch.long)
    greedy = [i for i, row in enumerate(rows) if row.sampling.greedy]
    if greedy:
        tokens[greedy] = scores[greedy].argmax(-1).cpu()
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        if not row.sampling.greedy:
            s = row.sampling
            groups[(s.temperature, s.top_k, s.top_p)].append(i)
    for (temperature, top_k, top_p), members in groups.items():
        probs = warp(scores[members], temperature, top_k, top_p).softmax(-1).cpu()
        shared = [j for j, i in enumerate(members) if rows[i].generator is None]
        if shared:
            drawn = torch.multinomial(probs[shared], 1).squeeze(1)
            tokens[[members[j] for j in shared]] = drawn
        for j, i in enumerate(members):
            if rows[i].generator is not None:
                drawn = torch.multinomial(probs[j : j + 1], 1, generator=rows[i].generator)
                tokens[i] = int(drawn)
    return _with_logprobs(scores, tokens, rows)


def _adjust(z: Tensor, row: Row) -> Tensor:
    s = row.sampling
    if s.logit_bias:
        ids, bias = zip(*s.logit_bias, strict=True)
        z = z.index_add(0, torch.tensor(ids, device=z.device), torch.tensor(bias, device=z.device))
    if s.repetition_penalty != 1.0:
        seen = torch.tensor(sorted({*row.prompt, *row.output}), dtype=torch.long, device=z.device)
        values = z[seen]
        penalised = torch.where(
            values < 0, values * s.repetition_penalty, values / s.repetition_penalty
        )
        z = z.index_copy(0, seen, penalised)
    if (s.presence_penalty or s.frequency_penalty) and row.output:
        counts = torch.bincount(torch.tensor(row.output, device=z.device), minlength=z.shape[0]).to(
            z.dtype
        )
        z = z - counts * s.frequency_penalty - (counts > 0).to(z.dtype) * s.presence_penalty
    return z


def _with_logprobs(scores: Tensor, tokens: Tensor, rows: list[Row]) -> list[Choice]:
    asked = [i for i, row in enumerate(rows) if row.sampling.logprobs is not None]
    choices = [Choice(int(t)) for t in tokens.tolist()]
    if not asked:
        return choices
    logprobs = torch.log_softmax(scores[asked], dim=-1).cpu()
    for j, i in enumerate(asked):
        k = rows[i].sampling.logprobs
        top = ()
        if k:
            values, ids = logprobs[j].topk(k)
            top = tuple(zip(ids.tolist(), values.tolist(), strict=True))
        token = choices[i].token
        choices[i] = Choice(token, float(logprobs[j, token]), top)
    return choices
