"""A request's outputs on the scheduler, as the event loop sees them: events as they come
(for a stream), or each output whole (for an answer), within the request's time limit.

A request of p prompts and n outputs each has outputs p * n, indexed prompt by
prompt as OpenAI's choices are. Greedy outputs of one prompt are all the same,
so one is decoded and its events are copied to the n indexes. When the request
ends early (the client gone, the time up), its outputs leave the batch at the
next step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio

from attnkit.generation.batching import Scheduler
from attnkit.generation.config import GenerationConfig
from attnkit.generation.rows import Event, Failed, Finish, Piece, Sequence, Token
from attnkit.serve.errors import ServeError


@dataclass
class Output:
    """One output, whole: its text, how it ended, its tokens (with log-probabilities if
    asked) and the tokens its prompt and it hold."""

    index: int
    text: str = ""
    reason: str | None = None
    tokens: list[Token] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def mean_logprob(self) -> float:
        values = [t.logprob for t in self.tokens if t.logprob is not None]
        return sum(values) / len(values) if values else 0.0


class Outputs:
    """The outputs of one request: `events` or `collect` them; `cancel` drops them."""

    def __init__(
        self,
        scheduler: Scheduler,
        model: Any,
        prompts: list[list[int]],
        sampling: GenerationConfig,
        n: int = 1,
        arrived: float | None = None,
    ) -> None:
        """`arrived`: when the request came (`time.perf_counter`), which its time to first
        token counts from; None: now."""
        arrived = time.perf_counter() if arrived is None else arrived
        self.n = n
        self.copies = n if sampling.greedy else 1  # indexes each decoded output stands for
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def emit(event: Event) -> None:
            loop.call_soon_threadsafe(self.queue.put_nowait, event)

        per_prompt = n // self.copies
        self.sequences = [
            Sequence(model, prompt, choice_sampling(sampling, j), emit,
                     index=(i * n + j * self.copies), arrived=arrived)
            for i, prompt in enumerate(prompts)
            for j in range(per_prompt)
        ]  # fmt: skip
        self.scheduler = scheduler
        scheduler.add(self.sequences)

    @property
    def count(self) -> int:
        """The outputs the request gets (its choices)."""
        return len(self.sequences) * self.copies

    async def events(self, timeout_s: float) -> AsyncIterator[Event]:
        """Each event of every output, copied to the indexes it stands for, until all have
        ended; 504 when one waits longer than `timeout_s`, 500 when decoding fails."""
        open_ = len(self.sequences)
        try:
            while open_:
                try:
                    # not asyncio.wait_for: on Python 3.10 and 3.11 it returns the event
                    # instead of raising when the request is cancelled in the step the event
                    # comes (CPython gh-86296), and a gone client's outputs decoded on to the end
                    with anyio.fail_after(timeout_s):
                        event = await self.queue.get()
                except TimeoutError:
                    raise ServeError(
                        504, f"the next token took longer than {timeout_s:g} s.", code="timeout"
                    ) from None
                if isinstance(event, Failed):
                    raise ServeError(
                        500,
                        f"decoding failed ({type(event.error).__name__}: {event.error}).",
                        code="internal_error",
                    )
                if isinstance(event, Finish):
                    open_ -= 1
                for k in range(self.copies):
                    yield _moved(event, event.index + k)
        finally:
            self.cancel()

    async def collect(self, timeout_s: float) -> list[Output]:
        """Every output, whole, once all have ended, within `timeout_s` in all."""
        outputs = [Output(i) for i in range(self.count)]

        async def gather() -> None:
            async for event in self.events(timeout_s):
                out = outputs[event.index]
                if isinstance(event, Piece):
                    out.text += event.text
                    out.tokens += event.tokens
                elif isinstance(event, Finish):
                    out.reason = event.reason
                    out.prompt_tokens = event.prompt_tokens
                    out.completion_tokens = event.completion_tokens

        try:
            with anyio.fail_after(timeout_s):
                await gather()
        except TimeoutError:
            raise ServeError(
                504, f"the result took longer than {timeout_s:g} s.", code="timeout"
            ) from None
        finally:
            self.cancel()
        return outputs

    def cancel(self) -> None:
        """Let the outputs still decoding leave the batch at the next step."""
        for sequence in self.sequences:
            sequence.cancelled = True


def choice_seed(seed: int, choice: int) -> int:
    """The seed of a prompt's `choice`-th output: the request's own for the first (so one
    output draws as `generate(..., seed=seed)` does), then one drawn from (seed, choice), so
    that n outputs differ from each other and each is the same again with the same seed."""
    if choice == 0:
        return seed
    digest = hashlib.sha256(f"{seed}/{choice}".encode()).digest()
    return int.from_bytes(digest[:4], "little")  # below 2**32, as GenerationConfig's seeds are


def choice_sampling(sampling: GenerationConfig, choice: int) -> GenerationConfig:
    """The options of a prompt's `choice`-th output: its own seed, if the request has one."""
    if sampling.seed is None or choice == 0:
        return sampling
    return dataclasses.replace(sampling, seed=choice_seed(sampling.seed, choice))


def _moved(event: Event, index: int) -> Event:
    if event.index == index:
        return event
    if isinstance(event, Piece):
        return Piece(index, event.text, event.tokens)
    if isinstance(event, Finish):
        return Finish(index, event.reason, event.prompt_tokens, event.completion_tokens)
    return event
