"""Each row's next token by its own `GenerationConfig`, and its log-probabilities.

For row r with logits z (the model's scores of the next token) and config c_r:

    z = process(z, prompt + output, c_r)      (the logits processors: bias, penalties, ...)
    logprobs = log_softmax(z)                 (what `logprobs` reports)
    y = argmax z                              (do_sample False)
    y ~ softmax(warp(z, temperature, top_k, top_p))   (do_sample True)

The processors are `generation/processors.py`'s, the ones `generate` runs on a
whole batch, here on each row with its own options. OpenAI defines its penalties
over the tokens sampled so far, as here; the log-probabilities are those of the
model's distribution after bias and penalties, before temperature and truncation.
A row with a `seed` draws from a generator of its own, seeded once, so its tokens
do not depend on its companions in the batch: the same draws as
`generate(..., seed=seed)` alone.

A row whose choice cannot be made (its options make the scores overflow, or leave
no token to draw) fails alone: `choose` tries the batch at once and, if that
raises, each row by itself, and hands back the error in the place of the failed
row's `Choice`, so that the batching engine fails that row and goes on with the
others.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnkit.generation.config import GenerationConfig
from attnkit.generation.processors import process, warp


@dataclass
class Row:
    """What choosing a row's next token reads: its options, prefix and output so far.

    `config` has its special ids resolved (`generation.config.resolve`); `prefix` is what
    precedes the output in the decoder (a decoder's prompt, an encoder-decoder's start id).
    """

    config: GenerationConfig
    prefix: list[int]
    output: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if self.generator is None and self.config.seed is not None and self.config.do_sample:
            self.generator = torch.Generator().manual_seed(self.config.seed)


@dataclass(frozen=True)
class Choice:
    """A chosen token with its log-probability and the most likely alternatives."""

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


def choose(logits: Tensor, rows: list[Row]) -> list[Choice | Exception]:
    """Each row's next token from `logits` (rows, vocab), by its own config; a row whose
    choice raises gets its error in the place of its `Choice`, the others their tokens."""
    states = [(row.generator, row.generator.get_state()) for row in rows if row.generator]
    try:
        return _choose(logits, rows)
    except Exception:  # some row's options: find it, choose the others' tokens alone
        for generator, state in states:  # a seeded row draws as if the batch had not failed
            generator.set_state(state)
    out: list[Choice | Exception] = []
    for i, row in enumerate(rows):
        try:
            out += _choose(logits[i : i + 1], [row])
        except Exception as error:
            out.append(error)
    return out


def _choose(logits: Tensor, rows: list[Row]) -> list[Choice]:
    scores = logits.float()
    adjusted = [i for i, row in enumerate(rows) if row.config.adjusts]
    if adjusted:
        scores = scores.clone()
        for i in adjusted:
            scores[i] = _process(scores[i], rows[i])
    tokens = torch.empty(len(rows), dtype=torch.long)
    greedy = [i for i, row in enumerate(rows) if not row.config.do_sample]
    if greedy:
        tokens[greedy] = scores[greedy].argmax(-1).cpu()
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        if row.config.do_sample:
            c = row.config
            groups[(c.temperature, c.top_k, c.top_p)].append(i)
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


def _process(z: Tensor, row: Row) -> Tensor:
    """One row's scores through the logits processors, its prefix and output as history."""
    c = row.config
    seqs = torch.tensor([row.prefix + row.output], dtype=torch.long, device=z.device)
    step = len(row.output)
    return process(z[None], seqs, None, step, c.max_new_tokens, c)[0]


def _with_logprobs(scores: Tensor, tokens: Tensor, rows: list[Row]) -> list[Choice]:
    asked = [i for i, row in enumerate(rows) if row.config.logprobs is not None]
    choices = [Choice(int(t)) for t in tokens.tolist()]
    if not asked:
        return choices
    logprobs = torch.log_softmax(scores[asked], dim=-1).cpu()
    for j, i in enumerate(asked):
        k = min(rows[i].config.logprobs, logprobs.shape[-1])  # no more than the vocabulary
        top = ()
        if k:
            values, ids = logprobs[j].topk(k)
            top = tuple(zip(ids.tolist(), values.tolist(), strict=True))
        token = choices[i].token
        choices[i] = Choice(token, float(logprobs[j, token]), top)
    return choices
