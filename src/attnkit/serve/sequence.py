"""One output being decoded, and the events it sends as its tokens are chosen.

An output is a prompt (a decoder's) or a source (an encoder-decoder's, its ids
ending in </s>), the `Sampling` that chooses its tokens, and `emit`, where its
events go: a `Piece` for each growth of its text (with the tokens behind it when
log-probabilities are asked), then one `Finish` (`stop`: its end token or a stop
string; `length`: `max_tokens` spent), or a `Failed`. `take` is what choosing a
token does to an output; the scheduler calls it, on its thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from attnkit.serve.sampler import Choice, Row, Sampling
from attnkit.serve.text import TextState, token_text


@dataclass(frozen=True)
class Token:
    """A chosen token as `logprobs` reports it: its text, log-probability, and the most
    likely tokens at its place with theirs."""

    text: str
    logprob: float | None  # None: the first token of an echoed prompt, which nothing predicts
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Piece:
    """Text an output grew by, and the tokens behind it (when log-probabilities are asked)."""

    index: int
    text: str
    tokens: list[Token]


@dataclass(frozen=True)
class Finish:
    """An output's end: `stop` (its end token or a stop string) or `length`, and its counts."""

    index: int
    reason: str
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Failed:
    index: int
    error: Exception


Event = Piece | Finish | Failed


@dataclass(eq=False)
class Sequence:
    """One output being decoded: a prompt (a decoder's) or a source (an encoder-decoder's, its
    ids ending in </s>), how its tokens are chosen, and where its events go."""

    model: Any  # the served model: `.model` and `.tokenizer`
    prompt: list[int]
    sampling: Sampling
    emit: Callable[[Event], None]
    index: int = 0
    cancelled: bool = False  # set from the event loop when the client has gone
    arrived: float = field(default_factory=time.perf_counter)
    first_token: float | None = None

    def __post_init__(self) -> None:
        self.row = Row(self.sampling, self.prompt)
        decoder = self.model.model.config.shape == "decoder"  # a source is not continued
        context = self.prompt if decoder else None
        self.text = TextState(self.model.tokenizer, self.sampling.stop, context)
        self.pending: list[Token] = []

    @property
    def output(self) -> list[int]:
        return self.row.output


def take(sequence: Sequence, choice: Choice) -> bool:
    """Add a chosen token to its output and send what it adds; whether the output goes on."""
    tokenizer, sampling = sequence.model.tokenizer, sequence.sampling
    eos = sequence.model.model.config.eos_id
    output = sequence.output
    if sampling.logprobs is not None:
        previous = output[-1] if output else None
        top = tuple((token_text(tokenizer, previous, t), lp) for t, lp in choice.top)
        text = token_text(tokenizer, previous, choice.token)
        sequence.pending.append(Token(text, choice.logprob, top))
    piece = ""
    if choice.token != eos:
        output.append(choice.token)
        piece = sequence.text.add(choice.token)
    stopped = choice.token == eos or sequence.text.stopped
    if stopped or len(output) >= sampling.max_tokens:
        end(sequence, "stop" if stopped else "length", piece)
        return False
    if piece:
        sequence.emit(Piece(sequence.index, piece, sequence.pending))
        sequence.pending = []
    return True


def end(sequence: Sequence, reason: str, piece: str = "") -> None:
    """Send the rest of an output's text, then its end."""
    piece += sequence.text.flush()
    if piece or sequence.pending:
        sequence.emit(Piece(sequence.index, piece, sequence.pending))
        sequence.pending = []
    prompt, output = len(sequence.prompt), len(sequence.output)
    sequence.emit(Finish(sequence.index, reason, prompt, output))
