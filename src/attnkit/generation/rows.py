"""One output being decoded (a row of the batching engine), and the events it sends as its
tokens are chosen.

An output is a prompt (a decoder's) or a source (an encoder-decoder's, its ids
ending in </s>), the `GenerationConfig` that chooses its tokens (its special ids
resolved once, from the tokenizer and the model, as it is made), and `emit`, where its
events go: a `Piece` for each growth of its text (with the tokens behind it when
log-probabilities are asked), then one `Finish` (`stop`: its end token or a stop
string; `length`: `max_new_tokens` spent), or a `Failed`. `take` is what choosing a
token does to an output; the scheduler calls it, on its thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from attnkit.generation.chooser import Choice, Row
from attnkit.generation.config import GenerationConfig, resolve
from attnkit.generation.text import TextState, token_text


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

    model: Any  # a loaded run (or a served one): `.model` and `.tokenizer`
    prompt: list[int]
    config: GenerationConfig
    emit: Callable[[Event], None]
    index: int = 0
    cancelled: bool = False  # set from the event loop when the client has gone
    arrived: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    streamed: bool = True  # False: its text is read whole at its end, decoded once there

    def __post_init__(self) -> None:
        self.config = resolve(self.config, {}, self.model.model.config, self.model.tokenizer)
        # the processors read what `generate` gives them: a decoder's prompt, an
        # encoder-decoder's start token (its source is not the output's history)
        decoder = self.model.model.config.shape == "decoder"
        prefix = self.prompt if decoder else [self.config.decoder_start_token_id]
        self.row = Row(self.config, prefix)
        context = self.prompt if decoder else None  # a decoder's text continues its prompt
        stops = self.config.stop_strings
        self.text = TextState(self.model.tokenizer, stops, context, whole=not self.streamed)
        self.pending: list[Token] = []

    @property
    def output(self) -> list[int]:
        return self.row.output


def take(sequence: Sequence, choice: Choice) -> bool:
    """Add a chosen token to its output and send what it adds; whether the output goes on."""
    tokenizer, config = sequence.model.tokenizer, sequence.config
    eos = config.eos_ids
    output = sequence.output
    if config.logprobs is not None:
        previous = output[-1] if output else None
        top = tuple((token_text(tokenizer, previous, t), lp) for t, lp in choice.top)
        text = token_text(tokenizer, previous, choice.token)
        sequence.pending.append(Token(text, choice.logprob, top))
    piece = ""
    if choice.token not in eos:
        output.append(choice.token)
        piece = sequence.text.add(choice.token)
    stopped = choice.token in eos or sequence.text.stopped
    if stopped or len(output) >= config.max_new_tokens:
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
