"""The HTTP routes of `attnkit serve`, their request shapes, limits and errors.

Requests and responses follow OpenAI's API where it has the endpoint
(`/v1/models`, `/v1/completions`, `/v1/embeddings`), so its clients work
unchanged; `/v1/translate` is attnkit's, with the command line's option names.
Errors and limits are `guard.py`'s; what a request may ask is bounded here
(`MAX_OUTPUTS` outputs or beams, `VIEW_TOKENS` tokens a side for attention).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from attnkit.checks import with_article
from attnkit.data.section import prepare_sources
from attnkit.serve import work
from attnkit.serve.batching import Batcher
from attnkit.serve.events import events
from attnkit.serve.guard import ServeError, add_guard
from attnkit.serve.metrics import Metrics
from attnkit.serve.page import add_page
from attnkit.serve.settings import ServeSettings
from attnkit.serve.work import Decoding, Output, Served

MAX_OUTPUTS = 16  # samples (n), beams or n-best a request may ask for


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI's clients send fields attnkit has no use for

    model: str


class CompletionRequest(_Request):
    prompt: str | list[str]
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1, le=MAX_OUTPUTS)
    stream: bool = False
    seed: int | None = Field(None, ge=0, lt=2**63)


class EmbeddingRequest(_Request):
    input: str | list[str]


class TranslationRequest(_Request):
    texts: list[str]
    beam: int = Field(1, ge=1, le=MAX_OUTPUTS)
    length_penalty: float = 1.0
    sample: bool = False
    temperature: float = Field(1.0, gt=0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    n_best: int = Field(1, ge=1, le=MAX_OUTPUTS)
    max_new_tokens: int = Field(128, ge=1)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stream: bool = False
    attention: bool = False  # also the attention of each text and its (first) translation


class AttentionRequest(_Request):
    text: str
    output: str | None = None  # the output to look at (the page's); None: greedy, VIEW_TOKENS


def create_app(served: Sequence[Served], settings: ServeSettings | None = None) -> FastAPI:
    """The server of `served` models, by name, with `settings`' limits."""
    settings = settings or ServeSettings()
    models = {s.name: s for s in served}
    metrics = Metrics()
    # a batch key: (work function, model, decoding options); the function does the batch
    batcher = Batcher(
        lambda key, items: key[0](key[1], key[2], items), settings.batch_wait_ms, settings.max_batch
    )
    app = FastAPI(title="attnkit", docs_url=None, redoc_url=None)
    app.state.batcher, app.state.metrics = batcher, metrics

    add_guard(app, settings, metrics)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "models": list(models)}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> str:
        return metrics.text(batcher, app.state.in_flight)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        created = int(time.time())
        data = [
            {
                "id": n,
                "object": "model",
                "created": created,
                "owned_by": "attnkit",
                "shape": s.shape,
            }
            for n, s in models.items()
        ]
        return {"object": "list", "data": data}

    def model_of(name: str, shape: str | None, endpoint: str) -> Served:
        if name not in models:
            raise ServeError(
                404, f"no model {name!r}; this server has {', '.join(models)}.", "not_found_error"
            )
        if shape is not None and models[name].shape != shape:
            raise ServeError(
                400,
                f"{endpoint} needs {with_article(shape)} model, but {name!r} is "
                f"{with_article(models[name].shape)} one.",
            )
        return models[name]

    def texts_of(value: str | list[str], field: str, empty: bool = True) -> list[str]:
        texts = [value] if isinstance(value, str) else value
        if not texts or len(texts) > settings.max_texts:
            raise ServeError(
                400, f"{field} must hold 1 to {settings.max_texts} texts, not {len(texts)}."
            )
        blank = next((i for i, t in enumerate(texts) if not t.strip()), None)
        if not empty and blank is not None:
            raise ServeError(400, f"{field} {blank} is empty.")
        return texts

    def encoded(served: Served, texts: list[str], field: str, **options: bool) -> list[list[int]]:
        limit = min(settings.max_input_tokens, served.model.config.max_len - 1)
        ids = [served.tokenizer.encode(t, **options) for t in texts]
        for i, row in enumerate(ids):
            if len(row) > limit:
                raise ServeError(400, f"{field} {i} has {len(row)} tokens; the limit is {limit}.")
        return ids

    def new_tokens(asked: int) -> int:
        if asked > settings.max_new_tokens:
            raise ServeError(
                400, f"at most {settings.max_new_tokens} new tokens may be asked for, not {asked}."
            )
        return asked

    async def run(key: tuple, items: list[Any], alone: bool = False) -> list[Any]:
        """The results of `items`, batched with other requests' unless `alone`."""
        if alone:
            waiting = batcher.run_alone(key, items)
        else:
            waiting = asyncio.gather(*(batcher.submit(key, item) for item in items))
        try:
            return await asyncio.wait_for(waiting, settings.timeout_s)
        except asyncio.TimeoutError:
            raise ServeError(
                504, f"the result took longer than {settings.timeout_s:g} s.", "timeout"
            ) from None

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> Any:
        served = model_of(body.model, "decoder", "/v1/completions")
        prompts = texts_of(body.prompt, "prompt")
        ids = [row or [served.tokenizer.bos_id] for row in encoded(served, prompts, "prompt")]
        decoding = Decoding(
            max_new_tokens=new_tokens(body.max_tokens), do_sample=body.temperature > 0,
            temperature=body.temperature or 1.0, top_p=body.top_p, n=body.n, seed=body.seed,
        )  # fmt: skip
        head = {
            "id": f"cmpl-{uuid.uuid4().hex[:24]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.model,
        }
        if body.stream:
            if len(prompts) != 1 or body.n != 1:
                raise ServeError(400, "a streamed completion takes one prompt and n = 1.")
            return StreamingResponse(
                events(batcher, served, decoding, ids[0], head, metrics, settings.timeout_s),
                media_type="text/event-stream",
            )
        key = (work.complete, served, decoding)
        outputs: list[Output] = await run(key, ids, alone=body.seed is not None)
        choices = [
            {"text": text, "index": i * body.n + j, "logprobs": None, "finish_reason": finish}
            for i, out in enumerate(outputs)
            for j, (text, finish) in enumerate(zip(out.texts, out.finish, strict=True))
        ]
        metrics.tokens(
            sum(o.prompt_tokens for o in outputs), sum(o.completion_tokens for o in outputs)
        )
        return {**head, "choices": choices, "usage": _usage(outputs)}

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest) -> Any:
        served = model_of(body.model, "encoder", "/v1/embeddings")
        ids = encoded(served, texts_of(body.input, "input", empty=False), "input")
        vectors = await run((work.embed, served, None), ids)
        tokens = sum(len(row) for row in ids)
        metrics.tokens(tokens, 0)
        data = [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)]
        return {
            "object": "list",
            "data": data,
            "model": body.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    @app.post("/v1/translate")
    async def translations(body: TranslationRequest) -> Any:
        served = model_of(body.model, "encoder-decoder", "/v1/translate")
        # As `attnkit translate` reads them: lowercased, a G2P word spelled out, as the run was
        # trained; every use below (limits, decoding, attention) sees the text the model reads.
        texts = prepare_sources(served.data, texts_of(body.texts, "texts"))
        encoded(served, texts, "text", add_eos=True)
        if body.n_best > body.beam and not body.sample:
            raise ServeError(
                400, f"n_best {body.n_best} needs a beam at least as wide, not beam {body.beam}."
            )
        decoding = Decoding(
            max_new_tokens=new_tokens(body.max_new_tokens), do_sample=body.sample,
            temperature=body.temperature, top_k=body.top_k, top_p=body.top_p, num_beams=body.beam,
            length_penalty=body.length_penalty, n=body.n_best, seed=body.seed,
        )  # fmt: skip
        if body.stream:
            if len(texts) != 1 or body.beam != 1 or body.n_best != 1:
                raise ServeError(400, "a streamed translation takes one text, beam 1 and n_best 1.")
            head = {
                "id": f"tr-{uuid.uuid4().hex[:24]}",
                "object": "translation.chunk",
                "model": body.model,
            }
            source = served.tokenizer.encode(texts[0], add_eos=True)
            stream = events(batcher, served, decoding, source, head, metrics, settings.timeout_s)
            return StreamingResponse(stream, media_type="text/event-stream")
        key = (work.translate, served, decoding)
        outputs: list[Output] = await run(key, texts, alone=body.seed is not None)
        metrics.tokens(
            sum(o.prompt_tokens for o in outputs), sum(o.completion_tokens for o in outputs)
        )
        items = [
            {"text": o.texts[0], "n_best": o.texts, "finish_reason": o.finish[0]} for o in outputs
        ]
        if body.attention:
            pairs = [(t, o.texts[0]) for t, o in zip(texts, outputs, strict=True)]
            views = await run((work.translation_attention, served, None), pairs, alone=True)
            for item, view in zip(items, views, strict=True):
                item["tokens"], item["attention"] = view["tokens"], view["attention"]
        return {
            "object": "translation",
            "model": body.model,
            "translations": items,
            "usage": _usage(outputs),
        }

    @app.post("/v1/attention")
    async def attention(body: AttentionRequest) -> Any:
        served = model_of(body.model, None, "/v1/attention")
        (text,) = texts_of(body.text, "text", empty=False)
        if served.shape == "encoder-decoder":  # a source, read as /v1/translate reads it
            (text,) = prepare_sources(served.data, [text])
        encoded(served, [text], "text")
        key = (work.attention, served, None)
        (view,) = await run(key, [(text, body.output)], alone=True)
        return {"object": "attention", "model": body.model, **view}

    add_page(app)
    app.router.on_shutdown.append(batcher.close)
    return app


def _usage(outputs: list[Output]) -> dict[str, int]:
    prompt = sum(o.prompt_tokens for o in outputs)
    completion = sum(o.completion_tokens for o in outputs)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
