"""The routes of OpenAI's API and of operations, as FastAPI routers; each reaches the server's
state through the `server` dependency.

    operations   GET /health (alive), /ready (can decode), /metrics (Prometheus)
    openai       GET /v1/models, /v1/models/{id}; POST /v1/completions,
                 /v1/chat/completions, /v1/embeddings

A route checks its request (`protocol.py`), turns its texts into ids off the
event loop (`Server.encode`), and hands the decoding to the scheduler
(`outputs.Outputs`) or the batcher (`work.py`), then answers in OpenAI's shape
(`answers.py`).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import torch
from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from attnkit.generation.rows import Token
from attnkit.serve import work
from attnkit.serve.answers import (
    Head,
    Stream,
    chat_choice,
    chat_logprobs,
    completion_logprobs,
    usage,
)
from attnkit.serve.errors import ServeError, invalid
from attnkit.serve.outputs import Output, Outputs
from attnkit.serve.protocol import ChatRequest, CompletionRequest, EmbeddingRequest
from attnkit.serve.runs import Served
from attnkit.serve.server import ArrivedDep, Server, ServerDep

operations = APIRouter()
openai = APIRouter(prefix="/v1")


@operations.get("/health")
async def health() -> dict[str, str]:
    """Alive: the process answers (never counted against the in-flight limit)."""
    return {"status": "ok"}


@operations.get("/ready", response_model=None)
async def ready(srv: ServerDep) -> dict[str, Any] | JSONResponse:
    """Ready: the models are loaded and the decoding thread runs; else 503."""
    if srv.draining or not srv.scheduler.thread.is_alive():
        return ServeError(503, "the server is not decoding.", code="not_ready").response()
    return {"status": "ready", "models": list(srv.models)}


@operations.get("/metrics")
async def metrics(srv: ServerDep) -> Response:
    return Response(srv.metrics.text(), media_type=CONTENT_TYPE_LATEST)


def _model_card(srv: Server, served: Served) -> dict[str, Any]:
    """A model as OpenAI lists it, with what it serves: `max_model_len`, the tokens it reads
    (an encoder's as its pooling cuts them, a decoder's context), and `max_input_tokens`, the
    longest input this server takes."""
    served_len = served.encoder.limit if served.shape == "encoder" else served.max_len
    return {
        "id": served.name,
        "object": "model",
        "created": int(srv.started),
        "owned_by": "attnkit",
        "shape": served.shape,
        "max_model_len": served_len,
        "max_input_tokens": srv.input_limit(served),
        "positional": served.model.config.positional,
    }


@openai.get("/models")
async def list_models(srv: ServerDep) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(srv, s) for s in srv.models.values()]}


@openai.get("/models/{model_id:path}")
async def retrieve_model(model_id: str, srv: ServerDep) -> dict[str, Any]:
    return _model_card(srv, srv.model(model_id, None, "/v1/models"))


@openai.post("/completions", response_model=None)
async def completions(
    body: CompletionRequest, srv: ServerDep, arrived: ArrivedDep
) -> dict[str, Any] | StreamingResponse:
    body.refusals()
    served = srv.model(body.model, ("decoder",), "/v1/completions")
    texts = srv.texts(body.prompt, "prompt")
    prompts = await srv.encode(served, texts, "prompt")
    n = body.n or 1
    best_of = body.best_of or n
    max_tokens = srv.new_tokens(served, body.max_tokens, "max_tokens")
    outputs_named = "prompts x best_of x max_tokens" if body.best_of else "prompts x n x max_tokens"
    srv.budget(len(prompts), best_of, max_tokens, outputs_named)
    # best_of ranks outputs by their log-probabilities, so they are computed even unasked
    logprobs = body.logprobs if body.logprobs is not None else (0 if best_of > n else None)
    sampling = srv.on_cache(body.sampling(max_tokens, served.model.config.vocab_size, logprobs))
    echoed = await _echoes(srv, served, texts, prompts, body) if body.echo else None
    head = Head("text_completion", body.model)
    prompt_tokens = sum(len(p) for p in prompts)

    def choice(index: int, text: str, tokens: list[Token], reason: str | None) -> dict:
        lp = completion_logprobs(tokens) if body.logprobs is not None else None
        return {"text": text, "index": index, "logprobs": lp, "finish_reason": reason}

    if body.stream:

        def opening(index: int) -> dict | None:
            if echoed is None:
                return None
            text, tokens = echoed[index // n]
            return choice(index, text, tokens, None)

        outputs = Outputs(srv.scheduler, served, prompts, sampling, n, arrived)
        stream = Stream(
            head, outputs, choice, opening, body.include_usage, prompt_tokens,
            srv.settings.timeout_s, lambda p, c: srv.metrics.tokens(served.name, p, c),
        )  # fmt: skip
        return StreamingResponse(stream.body(), media_type="text/event-stream")
    if max_tokens == 0:  # echo alone: the prompts scored
        outputs = [Output(i, "", "length", [], len(prompts[i // n])) for i in range(n * len(texts))]
    else:
        outputs = await Outputs(srv.scheduler, served, prompts, sampling, best_of, arrived).collect(
            srv.settings.timeout_s
        )
        outputs = _best(outputs, best_of, n)
    choices = []
    for out in outputs:
        text, tokens = out.text, out.tokens
        if echoed is not None:
            prompt_text, prompt_logprobs = echoed[out.index // n]
            text, tokens = prompt_text + text, prompt_logprobs + tokens
        choices.append(choice(out.index, text, tokens, out.reason))
    srv.metrics.tokens(served.name, prompt_tokens, sum(o.completion_tokens for o in outputs))
    return {**head.fields(), "choices": choices, "usage": usage(outputs, prompt_tokens)}


async def _echoes(
    srv: Server, served: Served, texts: list, prompts: list[list[int]], body: CompletionRequest
) -> list[tuple[str, list[Token]]]:
    """Each prompt's text, and its tokens' log-probabilities when asked (the first has none)."""
    shown = [t if isinstance(t, str) else served.tokenizer.decode(ids)
             for t, ids in zip(texts, prompts, strict=True)]  # fmt: skip
    if body.logprobs is None:
        return [(text, []) for text in shown]
    scored = await srv.run((work.prompt_logprobs, served, body.logprobs), prompts, alone=True)
    return list(zip(shown, scored, strict=True))


def _best(outputs: list[Output], best_of: int, n: int) -> list[Output]:
    """Of each prompt's `best_of` outputs, the `n` of highest mean log-probability, reindexed."""
    if best_of == n:
        return outputs
    kept = []
    for start in range(0, len(outputs), best_of):
        group = sorted(outputs[start : start + best_of], key=lambda o: -o.mean_logprob)[:n]
        for j, out in enumerate(group):
            out.index = start // best_of * n + j
            kept.append(out)
    return kept


@openai.post("/chat/completions", response_model=None)
async def chat_completions(
    body: ChatRequest, srv: ServerDep, arrived: ArrivedDep
) -> dict[str, Any] | StreamingResponse:
    body.refusals()
    served = srv.model(body.model, None, "/v1/chat/completions")
    if served.chat is None:
        raise invalid(
            "model",
            f"{body.model!r} is {'an encoder' if served.shape == 'encoder' else 'a translation'} "
            f"model, which cannot chat; use "
            f"{'/v1/embeddings' if served.shape == 'encoder' else '/v1/translate'}.",
            code="model_not_supported",
        )
    messages = [
        {"role": m.role, "content": m.text(f"messages.{i}")} for i, m in enumerate(body.messages)
    ]
    prompt = await asyncio.to_thread(served.chat.render, messages)
    prompts = await srv.encode(served, [prompt], "messages", what="the chat's prompt")
    n = body.n or 1
    param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    max_tokens = srv.new_tokens(served, body.new_tokens, param)
    srv.budget(1, n, max_tokens, f"a chat x n x {param}", param)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    sampling = srv.on_cache(body.sampling(max_tokens, served.model.config.vocab_size, logprobs))
    head = Head("chat.completion", body.model)
    extra = {"service_tier": "default"} if body.service_tier else {}
    outputs = Outputs(srv.scheduler, served, prompts, sampling, n, arrived)
    if body.stream:

        def chunk(index: int, text: str, tokens: list[Token], reason: str | None) -> dict:
            delta = {"content": text} if reason is None else {}
            lp = chat_logprobs(tokens) if logprobs is not None and reason is None else None
            return {"index": index, "delta": delta, "logprobs": lp, "finish_reason": reason}

        def opening(index: int) -> dict:
            delta = {"role": "assistant", "content": ""}
            return {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}

        stream = Stream(
            head, outputs, chunk, opening, body.include_usage, len(prompts[0]),
            srv.settings.timeout_s, lambda p, c: srv.metrics.tokens(served.name, p, c),
        )  # fmt: skip
        return StreamingResponse(stream.body(), media_type="text/event-stream")
    done = await outputs.collect(srv.settings.timeout_s)
    srv.metrics.tokens(served.name, len(prompts[0]), sum(o.completion_tokens for o in done))
    return {
        **head.fields(),
        "choices": [chat_choice(o, logprobs is not None) for o in done],
        "usage": usage(done, len(prompts[0])),
        **extra,
    }


@openai.post("/embeddings")
async def embeddings(body: EmbeddingRequest, srv: ServerDep) -> dict[str, Any]:
    served = srv.model(body.model, ("encoder",), "/v1/embeddings")
    size = served.model.config.d_model * len(served.encoder.pooling.modes)
    if body.dimensions not in (None, size):
        raise invalid(
            "dimensions",
            f"{body.model!r} gives vectors of {size} dimensions, which it was not trained to "
            f"shorten; leave dimensions out or ask for {size}.",
        )
    texts = srv.texts(body.input, "input", empty=False)
    ids = await srv.encode(served, texts, "input", truncate=bool(body.truncate))
    vectors: list[torch.Tensor] = await srv.run((work.embed, served, None), ids)
    tokens = sum(len(row) for row in ids)
    srv.metrics.tokens(served.name, tokens, 0)
    data = [
        {"object": "embedding", "embedding": _encoded(v, body.encoding_format), "index": i}
        for i, v in enumerate(vectors)
    ]
    return {
        "object": "list",
        "data": data,
        "model": body.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _encoded(vector: torch.Tensor, encoding: str | None) -> list[float] | str:
    """A vector as floats, or as OpenAI's base64: its float32 bytes, little-endian."""
    if encoding == "base64":
        data = vector.to(torch.float32).numpy().astype("<f4").tobytes()
        return base64.b64encode(data).decode("ascii")
    return vector.tolist()
