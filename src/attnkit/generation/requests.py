"""A prompt submitted to the batching engine (`Request`) and its output (`Completion`).

A `Request` is the caller's handle on one output decoded by `attnkit.LLM`: the events of
its row or job (`rows.Piece`, `rows.Finish`, `rows.Failed`) arrive in its queue from the
decoding thread, and the caller's thread reads them, as text pieces (iterating it) or as
one `Completion` (`result()`). Cancelling it lets its row leave at the next step, or its
job stop, once every request of that job has been cancelled.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass

from attnkit.errors import AttnkitError
from attnkit.generation.config import GenerationConfig
from attnkit.generation.rows import Failed, Piece, Token
from attnkit.generation.rows import Sequence as Row


@dataclass(frozen=True)
class Completion:
    """One prompt's output: its text and ids (the end token left out), why it ended (`stop`:
    an end token or a stop string; `length`: max_new_tokens spent), the prompt's tokens, and,
    when `logprobs` was asked, each chosen token with its log-probability and alternatives.
    A beam search's `n_best` holds its `num_return_sequences` best texts with their
    length-penalised scores, best first (the first is `text`)."""

    prompt: str
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    logprobs: list[Token] | None = None
    n_best: list[tuple[str, float | None]] | None = None


class Request:
    """A prompt submitted to an `LLM`: iterate it for its text as it comes, or wait for its
    `result()`; `cancel()` lets it leave the batch at the next step."""

    def __init__(self, prompt: str, ids: list[int], config: GenerationConfig) -> None:
        self.prompt, self.ids, self.config = prompt, ids, config
        self.events: queue.Queue = queue.Queue()
        self.row: Row | None = None
        self.job: Future | None = None
        self.group: list[Request] = []  # the requests of its job, which cancel it together
        self.cancelled = False
        self.whole_ids: list[int] | None = None  # a whole `generate`'s output, from its job
        self.n_best: list[tuple[str, float | None]] | None = None
        self._done: Completion | None = None
        self._error: AttnkitError | None = None
        self._text: list[str] = []
        self._tokens: list[Token] = []

    def __iter__(self) -> Iterator[str]:
        """Each piece the text grows by, until the output ends; raises if it fails."""
        try:
            while self._done is None:
                piece = self._next()
                if piece:
                    yield piece
        finally:
            if self._done is None:  # the caller stopped reading: decode no further
                self.cancel()

    def result(self, timeout: float | None = None) -> Completion:
        """The whole output, once it has ended (waiting at most `timeout` seconds a token)."""
        while self._done is None:
            self._next(timeout)
        return self._done

    def cancel(self) -> None:
        self.cancelled = True
        if self.row is not None:
            self.row.cancelled = True
        if self.job is not None and all(r.cancelled for r in self.group):
            self.job.cancel()

    def _next(self, timeout: float | None = None) -> str:
        """Take one event: its text (a piece), or the end recorded; a failure raised."""
        if self._error is not None:
            raise self._error
        try:
            event = self.events.get(timeout=timeout)
        except queue.Empty:
            raise AttnkitError(f"no token came within {timeout:g} s") from None
        if isinstance(event, Failed):
            if isinstance(event.error, AttnkitError):  # a refusal says itself
                self._error = event.error
                raise self._error
            self._error = AttnkitError(
                f"decoding {self.prompt[:40]!r} failed ({type(event.error).__name__}: "
                f"{event.error}); change its options"
            )
            raise self._error from event.error
        if isinstance(event, Piece):
            self._text.append(event.text)
            self._tokens += event.tokens
            return event.text
        ids = list(self.row.output) if self.row is not None else self.whole_ids or []
        self._done = Completion(
            self.prompt,
            "".join(self._text),
            ids,
            event.reason,
            event.prompt_tokens,
            self._tokens if self.config.logprobs is not None else None,
            self.n_best,
        )
        return ""
