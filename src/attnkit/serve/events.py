"""A streamed answer as server-sent events: `data: {chunk}` a piece of text, the last chunk
with its finish reason, then `data: [DONE]`, as OpenAI's streaming does.

The tokens come from a decode on the batcher's stream threads; each step waits at
most `timeout_s` for the next piece, and when the client goes away (or the wait
times out) the decode stops at its next step instead of running to its end.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator

from attnkit.serve import work
from attnkit.serve.batching import Batcher
from attnkit.serve.metrics import Metrics
from attnkit.serve.work import Decoding, Output, Served


async def events(
    batcher: Batcher,
    served: Served,
    decoding: Decoding,
    prompt: list[int],
    head: dict,
    metrics: Metrics,
    timeout_s: float,
) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    gone = threading.Event()

    def produce() -> None:
        try:
            for piece in work.stream_completion(served, decoding, prompt):
                if gone.is_set():
                    return
                loop.call_soon_threadsafe(queue.put_nowait, piece)
        except Exception as error:  # handed to the answer, which says it in an event
            loop.call_soon_threadsafe(queue.put_nowait, error)

    loop.run_in_executor(batcher.stream_executor, produce)
    try:
        while True:
            try:
                piece = await asyncio.wait_for(queue.get(), timeout_s)
            except asyncio.TimeoutError:
                piece = TimeoutError(f"the next token took longer than {timeout_s:g} s")
            if isinstance(piece, Exception):
                error = {"message": f"{piece}.", "type": "server_error", "code": 500}
                yield _event({"error": error})
                break
            finish = piece.finish[0] if isinstance(piece, Output) else None
            text = "" if isinstance(piece, Output) else piece
            yield _event({**head, "choices": [_choice(text, finish)]})
            if isinstance(piece, Output):
                metrics.tokens(piece.prompt_tokens, piece.completion_tokens)
                break
        yield "data: [DONE]\n\n"
    finally:  # the end, or the client gone: the decode stops at its next token
        gone.set()


def _choice(text: str, finish: str | None) -> dict:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}


def _event(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"
