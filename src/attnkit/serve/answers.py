"""Answers in OpenAI's shapes: completion and chat choices, their log-probabilities, stream
chunks as server-sent events, and usage.

    completions:  choices[i] = {text, index, logprobs, finish_reason}
                  logprobs = {tokens, token_logprobs, top_logprobs, text_offset}
    chat:         choices[i] = {index, message: {role, content}, logprobs, finish_reason}
                  logprobs = {content: [{token, logprob, bytes, top_logprobs}]}
    a stream:     `data: {chunk}` per piece (chat: a `delta`), the finish reason in the
                  last chunk of each choice, a usage chunk if asked, then `data: [DONE]`

An error after a stream has started cannot change its status: it is sent as a
last event, `data: {"error": {...}}`, before `[DONE]`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from attnkit.generation.rows import Finish, Piece, Token
from attnkit.serve.errors import ServeError
from attnkit.serve.outputs import Output, Outputs


@dataclass
class Head:
    """What every answer and chunk of one request repeats."""

    kind: str  # "text_completion" or "chat.completion"
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        prefix = "chatcmpl" if self.kind == "chat.completion" else "cmpl"
        self.id = self.id or f"{prefix}-{uuid.uuid4().hex[:24]}"

    def fields(self, chunk: bool = False) -> dict[str, Any]:
        kind = f"{self.kind}.chunk" if chunk and self.kind == "chat.completion" else self.kind
        head = {"id": self.id, "object": kind, "created": self.created, "model": self.model}
        if self.kind == "chat.completion":
            head["system_fingerprint"] = None
        return head


def usage(outputs: list[Output], prompt_tokens: int) -> dict[str, int]:
    completion = sum(o.completion_tokens for o in outputs)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


def completion_logprobs(tokens: list[Token]) -> dict[str, Any]:
    """The completions API's log-probabilities, each token's text at its offset in the text."""
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token.text)
    return {
        "tokens": [t.text for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [dict(t.top) for t in tokens],
        "text_offset": offsets,
    }


def chat_logprobs(tokens: list[Token]) -> dict[str, Any]:
    """The chat API's log-probabilities."""

    def entry(text: str, logprob: float) -> dict[str, Any]:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    content = [
        {**entry(t.text, t.logprob), "top_logprobs": [entry(s, lp) for s, lp in t.top]}
        for t in tokens
    ]
    return {"content": content, "refusal": None}


def chat_choice(output: Output, logprobs: bool) -> dict[str, Any]:
    return {
        "index": output.index,
        "message": {"role": "assistant", "content": output.text, "refusal": None},
        "logprobs": chat_logprobs(output.tokens) if logprobs else None,
        "finish_reason": output.reason,
    }


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


@dataclass
class Stream:
    """How one request's events become chunks.

    chunk: (index, text, tokens, finish reason) -> the `choices` entry of a chunk.
    first: the chunks each choice opens with (a chat's role), by index.
    """

    head: Head
    outputs: Outputs
    chunk: Callable[[int, str, list[Token], str | None], dict[str, Any]]
    first: Callable[[int], dict[str, Any] | None] = lambda index: None
    include_usage: bool = False
    prompt_tokens: int = 0
    timeout_s: float = 120.0
    on_end: Callable[[int, int], None] = lambda prompt, completion: None

    async def body(self) -> AsyncIterator[str]:
        """The server-sent events of the whole answer."""
        fields = self.head.fields(chunk=True)
        extra = {"usage": None} if self.include_usage else {}
        completion = 0
        try:
            for index in range(self.outputs.count):
                opening = self.first(index)
                if opening is not None:
                    yield sse({**fields, "choices": [opening], **extra})
            async for event in self.outputs.events(self.timeout_s):
                if isinstance(event, Piece):
                    choice = self.chunk(event.index, event.text, event.tokens, None)
                elif isinstance(event, Finish):
                    completion += event.completion_tokens
                    choice = self.chunk(event.index, "", [], event.reason)
                else:
                    continue
                yield sse({**fields, "choices": [choice], **extra})
            if self.include_usage:
                tokens = {
                    "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": completion,
                    "total_tokens": self.prompt_tokens + completion,
                }
                yield sse({**fields, "choices": [], "usage": tokens})
        except ServeError as error:
            yield sse(error.body())
        finally:  # the end, or the client gone: the outputs leave the batch
            self.outputs.cancel()
            self.on_end(self.prompt_tokens, completion)
        yield sse("[DONE]")
