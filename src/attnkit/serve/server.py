"""A server's state, which every route reaches through a dependency (`server`): the models by
name, the settings, the scheduler and the batcher, the metrics, and the checks that turn
a request's texts into the ids a model reads.

Request text is tokenized on a worker thread, never on the event loop, so a long
text delays only its own request; its length is checked against the server's
`max_input_tokens` and the model's `max_len` before any decoding starts.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import time
from collections.abc import Sequence
from typing import Annotated, Any

import anyio
from fastapi import Depends, Request

from attnkit.checks import with_article
from attnkit.generation.batching import Scheduler
from attnkit.generation.config import GenerationConfig
from attnkit.serve.batching import Batcher
from attnkit.serve.errors import ServeError, invalid
from attnkit.serve.metrics import Metrics
from attnkit.serve.runs import Served
from attnkit.serve.settings import ServeSettings


class Server:
    """Everything a request needs, made once per app (`create_app`)."""

    def __init__(self, served: Sequence[Served], settings: ServeSettings) -> None:
        self.settings = settings
        self.models = {s.name: s for s in served}
        self.metrics = metrics = Metrics()
        self.scheduler = Scheduler(
            settings.max_batch,
            on_first_token=metrics.first_token.observe,
            kv_blocks=settings.kv_blocks,
        )
        # a batch key: (work function, model, options); the function does the batch
        self.batcher = Batcher(
            lambda key, items: key[0](key[1], key[2], items),
            settings.batch_wait_ms,
            settings.max_batch,
            self.scheduler,
        )
        self.in_flight = 0
        self.draining = False  # set at shutdown: not ready any more
        self.started = time.time()
        scheduler = self.scheduler
        metrics.gauge("attnkit_queue_length", "Outputs waiting to join.", lambda: scheduler.queued)
        metrics.gauge("attnkit_running_rows", "Rows decoding.", lambda: scheduler.running)
        metrics.counter("attnkit_decode_steps", "Decoding steps run.", lambda: scheduler.steps)
        metrics.gauge(
            "attnkit_generation_tokens_per_second",
            "Tokens chosen a second over the last 10 s.",
            lambda: metrics.rate(scheduler.tokens),
        )
        metrics.counter("attnkit_batches", "Batches of work run.", lambda: self.batcher.batches)
        metrics.counter("attnkit_batched_requests", "Items those held.", lambda: self.batcher.items)
        metrics.gauge(
            "attnkit_requests_in_flight", "/v1 requests being answered.", lambda: self.in_flight
        )

    def model(self, name: str, shapes: tuple[str, ...] | None, endpoint: str) -> Served:
        """The served model `name`, refused if unknown or not of one of `shapes`."""
        if name not in self.models:
            raise ServeError(
                404,
                f"no model {name!r}; this server has {', '.join(self.models)}.",
                param="model",
                code="model_not_found",
            )
        served = self.models[name]
        noted = REQUEST_NOTES.get()
        if noted is not None:  # the model the request's latency is labelled with
            noted["model"] = name
        if shapes is not None and served.shape not in shapes:
            needs = " or ".join(with_article(s) for s in shapes)
            raise invalid(
                "model",
                f"{endpoint} needs {needs} model, but {name!r} is "
                f"{with_article(served.shape)} one.",
                code="model_not_supported",
            )
        return served

    def texts(
        self, value: str | list[str] | list[int] | list[list[int]], param: str, empty: bool = True
    ) -> list[str] | list[list[int]]:
        """The texts (or token-id lists) of a request field, 1 to `max_texts` of them.

        Where a request's text enters: every endpoint reads the texts this returns (prompts,
        inputs, sources, the attention view's text) from here, so a run's own preparation of
        its input (as `attnkit translate` reads it) belongs here, once."""
        if isinstance(value, str):
            texts: list[Any] = [value]
        elif value and all(isinstance(x, int) for x in value):
            texts = [value]  # one prompt given as ids
        else:
            texts = list(value)
        limit = self.settings.max_texts
        if not texts or len(texts) > limit:
            raise invalid(param, f"{param} must hold 1 to {limit} texts, not {len(texts)}.")
        for i, text in enumerate(texts):
            if isinstance(text, list) and not text:  # no token to read: nothing to continue
                raise invalid(param, f"{param} {i} is an empty list of token ids.")
            if not empty and isinstance(text, str) and not text.strip():
                raise invalid(param, f"{param} {i} is empty.")
        return texts

    async def encode(
        self,
        served: Served,
        texts: list[str] | list[list[int]],
        param: str,
        truncate: bool = False,
        what: str | None = None,
    ) -> list[list[int]]:
        """The ids a model reads for `texts` (token ids are checked against its vocabulary),
        each within the server's and the model's limits; tokenized off the event loop. A text
        too long is named `what`, else `param` and its index."""
        limit = self.input_limit(served)
        if texts and isinstance(texts[0], list):
            ids_of = self._given_ids(served, texts, param, truncate)
        else:
            texts = self._bounded(served, texts, limit, param, truncate, what)
            ids_of = await asyncio.to_thread(served.encode, texts, truncate)
        for i, row in enumerate(ids_of):
            if len(row) > limit:
                raise ServeError(
                    400,
                    f"{what or f'{param} {i}'} has {len(row)} tokens; the limit is {limit}.",
                    param=param,
                    code="context_length_exceeded",
                )
        return ids_of

    def _bounded(
        self,
        served: Served,
        texts: list[str],
        limit: int,
        param: str,
        truncate: bool,
        what: str | None,
    ) -> list[str]:
        """The texts, each checked by its characters before it is tokenized: one longer than
        `limit` tokens could spell (each its longest token and a space) is over the limit,
        said without tokenizing it whole; one to be truncated is cut there first."""
        most = limit * (served.longest_token + 1)
        if truncate:
            return [text[:most] for text in texts]
        for i, text in enumerate(texts):
            if len(text) > most:
                raise ServeError(
                    400,
                    f"{what or f'{param} {i}'} has {len(text):,} characters, more than "
                    f"{limit:,} tokens of this model can hold; the limit is {limit} tokens.",
                    param=param,
                    code="context_length_exceeded",
                )
        return texts

    def _given_ids(
        self, served: Served, rows: list[list[int]], param: str, truncate: bool
    ) -> list[list[int]]:
        """Token ids given for text, checked against the vocabulary; an encoder's are put
        between its special tokens, as its text's are."""
        vocab = served.model.config.vocab_size
        for i, ids in enumerate(rows):
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise invalid(param, f"{param} {i} holds the id {bad}, outside 0 to {vocab - 1}.")
        if served.shape != "encoder":
            return [list(row) for row in rows]
        tokenizer, limit = served.tokenizer, served.encoder.limit - 2
        return [
            [tokenizer.bos_id, *(row[:limit] if truncate else row), tokenizer.eos_id]
            for row in rows
        ]

    def on_cache(self, config: GenerationConfig) -> GenerationConfig:
        """A request's rows on the cache the operator chose (`--cache-implementation`)."""
        return dataclasses.replace(config, cache_implementation=self.settings.cache_implementation)

    def input_limit(self, served: Served) -> int:
        """The most ids of one input: a decoder's prompt leaves room for one new token."""
        limit = served.max_len - (served.shape == "decoder")
        if served.shape == "encoder":
            limit = served.encoder.limit
        return min(self.settings.max_input_tokens, limit)

    def new_tokens(self, served: Served, asked: int | None, param: str) -> int:
        """The new tokens an output may have: as `asked` (None: the server's most), refused
        over `max_new_tokens`; an encoder-decoder's stop at its max_len, as `generate`'s do."""
        most = self.settings.max_new_tokens
        if asked is not None and asked > most:
            raise invalid(param, f"at most {most} new tokens may be asked for, not {asked}.")
        tokens = most if asked is None else asked
        if served.shape == "encoder-decoder":
            tokens = min(tokens, served.max_len - 1)
        return tokens

    def budget(
        self, texts: int, outputs: int, max_tokens: int, names: str, param: str = "max_tokens"
    ) -> None:
        """Refuse a request whose new tokens in all (texts x outputs x max_tokens, `names`
        saying what they are called) outgrow `max_request_tokens`."""
        most, asked = self.settings.max_request_tokens, texts * outputs * max_tokens
        if asked > most:
            default = ServeSettings().max_request_tokens
            raise ServeError(
                400,
                f"this request asks for up to {asked:,} new tokens ({names}: {texts} x "
                f"{outputs} x {max_tokens}), over the server's max_request_tokens of {most:,} "
                f"(--max-request-tokens, default {default:,}); ask for fewer.",
                param=param,
                code="request_too_large",
            )

    async def run(self, key: tuple, items: list[Any], alone: bool = False) -> list[Any]:
        """The results of `items` from the batcher, batched with other requests' unless
        `alone`, within the request's time limit."""
        batcher = self.batcher
        if alone:
            waiting = batcher.run_alone(key, items)
        else:
            waiting = asyncio.gather(*(batcher.submit(key, item) for item in items))
        timeout = self.settings.timeout_s
        with anyio.move_on_after(timeout):  # not a TimeoutError: the work may raise its own
            return await waiting
        raise ServeError(504, f"the result took longer than {timeout:g} s.", code="timeout")

    def close(self) -> None:
        self.draining = True
        self.batcher.close()
        self.scheduler.shutdown(wait=False)


def server(request: Request) -> Server:
    """The dependency of every route: the app's `Server`."""
    return request.app.state.server


# What a request's handling notes for the guard (its model): a dict the guard sets before the
# app runs, which the app's task sees through its copy of the context
REQUEST_NOTES: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "attnkit_request_notes", default=None
)
ARRIVED = "attnkit.arrived"  # the scope's key: when the guard first saw the request


def arrived(request: Request) -> float:
    """When the request arrived (`time.perf_counter`), as the guard noted it: a time to first
    token counts from there, as its client's does."""
    return request.scope.get(ARRIVED, time.perf_counter())


ServerDep = Annotated[Server, Depends(server)]
ArrivedDep = Annotated[float, Depends(arrived)]
