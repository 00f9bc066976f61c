"""attnkit's own routes: `/v1/translate`, with the command line's option names, and
`/v1/attention`, every attention weight of a text and its output, for the page's viewer.

How a request decodes is the engine's decision (`generation.ways.way`), the one
`attnkit.LLM` and `attnkit translate` take: greedy and sampled translations decode
on the scheduler, token by token, joining the running batch (streamed or not), n_best
of them as n rows; beam searches run a few steps a slice between the rows' steps, and a
pointer-generator's translations through `inference.translate` (`work.translate`).
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from attnkit.generation import GenerationConfig
from attnkit.generation.rows import Token
from attnkit.generation.ways import ROWS, way
from attnkit.serve import work
from attnkit.serve.answers import Head, Stream
from attnkit.serve.outputs import Outputs
from attnkit.serve.protocol import AttentionRequest, TranslationRequest
from attnkit.serve.server import ArrivedDep, Server, ServerDep

router = APIRouter(prefix="/v1")


@router.post("/translate", response_model=None)
async def translations(
    body: TranslationRequest, srv: ServerDep, arrived: ArrivedDep
) -> dict[str, Any] | StreamingResponse:
    body.refusals()
    served = srv.model(body.model, ("encoder-decoder",), "/v1/translate")
    texts = srv.texts(body.texts, "texts")
    sources = await srv.encode(served, texts, "texts")
    max_new = srv.new_tokens(served, body.max_new_tokens, "max_new_tokens")
    width = max(body.beam, body.n_best)
    names = "texts x beam x max_new_tokens" if body.beam > 1 else "texts x n_best x max_new_tokens"
    srv.budget(len(texts), width, max_new, names, "max_new_tokens")
    decoding = GenerationConfig(
        max_new_tokens=max_new, do_sample=body.sample, temperature=body.temperature,
        top_k=body.top_k, top_p=body.top_p, num_beams=body.beam,
        length_penalty=body.length_penalty, num_return_sequences=body.n_best, seed=body.seed,
    )  # fmt: skip
    # sampled n_best are n rows of one output each
    row = dataclasses.replace(decoding, num_return_sequences=1) if body.beam == 1 else decoding
    row = srv.on_cache(row)
    if way(served.model.config, row) == ROWS:
        todo = [i for i, t in enumerate(texts) if t.strip()]  # an empty text: an empty one
        todo_sources = [sources[i] for i in todo]
        outputs = Outputs(srv.scheduler, served, todo_sources, row, body.n_best, arrived)
        if body.stream:
            return _stream(srv, served.name, body, outputs, len(sources[0]))
        done = await outputs.collect(srv.settings.timeout_s)
        n = body.n_best
        items = [{"text": "", "n_best": [""] * n, "finish_reason": "stop"} for _ in texts]
        for k, i in enumerate(todo):
            mine = done[k * n : (k + 1) * n]
            items[i] = {"text": mine[0].text, "n_best": [o.text for o in mine],
                        "finish_reason": mine[0].reason}  # fmt: skip
        prompt = sum(len(sources[i]) for i in todo)
        completion = sum(o.completion_tokens for o in done)
    else:
        key = (work.translate, served, decoding)
        results = await srv.run(key, list(zip(texts, sources, strict=True)), body.seed is not None)
        items = [{"text": r.texts[0], "n_best": r.texts, "finish_reason": r.finish[0]}
                 for r in results]  # fmt: skip
        prompt = sum(r.prompt_tokens for r in results)
        completion = sum(r.completion_tokens for r in results)
    srv.metrics.tokens(served.name, prompt, completion)
    if body.attention:
        pairs = [(t, item["text"]) for t, item in zip(texts, items, strict=True)]
        views = await srv.run((work.translation_attention, served, None), pairs, alone=True)
        for item, view in zip(items, views, strict=True):
            item.update(tokens=view["tokens"], labels=view["labels"], attention=view["attention"])
    return {
        "object": "translation",
        "model": body.model,
        "translations": items,
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    }  # fmt: skip


def _stream(
    srv: Server, name: str, body: TranslationRequest, outputs: Outputs, source_tokens: int
) -> StreamingResponse:
    head = Head("translation.chunk", body.model, id=f"tr-{uuid.uuid4().hex[:24]}")

    def chunk(index: int, text: str, tokens: list[Token], reason: str | None) -> dict:
        return {"text": text, "index": index, "logprobs": None, "finish_reason": reason}

    stream = Stream(
        head, outputs, chunk, prompt_tokens=source_tokens, timeout_s=srv.settings.timeout_s,
        on_end=lambda p, c: srv.metrics.tokens(name, p, c),
    )  # fmt: skip
    return StreamingResponse(stream.body(), media_type="text/event-stream")


@router.post("/attention")
async def attention(body: AttentionRequest, srv: ServerDep) -> dict[str, Any]:
    served = srv.model(body.model, None, "/v1/attention")
    (text,) = srv.texts(body.text, "text", empty=False)
    await srv.encode(served, [text], "text")
    (view,) = await srv.run((work.attention, served, None), [(text, body.output)], True)
    return {"object": "attention", "model": body.model, **view}
