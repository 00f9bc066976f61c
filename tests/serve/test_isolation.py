"""Work that does not block other work: sentence vectors without the vocabulary projection, a
large batch of them split into pieces between the decoding steps of a running stream, and a
request whose client goes away cancelled with its rows freed."""

from __future__ import annotations

import itertools
import time

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from attnkit.pooling import SentenceEncoder, pool
from attnkit.serve import work
from attnkit.serve.app import create_app
from attnkit.serve.runs import Served
from attnkit.serve.settings import ServeSettings
from tests.serve.live import serving


def test_embeddings_skip_the_vocabulary_projection(served: list[Served]) -> None:
    bert = served[1]
    projected = []
    hook = bert.model.head.register_forward_hook(lambda *args: projected.append(1))
    try:
        with TestClient(create_app(served)) as client:
            out = client.post("/v1/embeddings", json={"model": "bert", "input": ["a dog", "zwei"]})
    finally:
        hook.remove()
    assert out.status_code == 200 and projected == []
    ids = bert.encoder.ids(["a dog"])
    with torch.no_grad():
        hidden = bert.model(torch.tensor(ids), need_logits=False).hidden
    expected = pool(hidden, torch.ones(1, len(ids[0]), dtype=torch.bool), bert.encoder.pooling)
    torch.testing.assert_close(torch.tensor(out.json()["data"][0]["embedding"]), expected[0])


def test_a_large_embedding_batch_runs_in_pieces_between_a_streams_steps(
    served: list[Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(work, "SLICE_S", 1e-12)  # every piece one input, whatever its pace
    monkeypatch.setattr(work, "FIRST_PIECE", 1)
    app = create_app(served, ServeSettings(batch_wait_ms=0))
    steps: list[int] = []
    original = SentenceEncoder.encode_ids

    def counted(self: SentenceEncoder, ids: list, batch_size: int = 32) -> torch.Tensor:
        steps.append(app.state.server.scheduler.steps)
        return original(self, ids, batch_size)

    monkeypatch.setattr(SentenceEncoder, "encode_ids", counted)
    eos = str(served[0].model.config.eos_id)
    stream = {"model": "gpt", "prompt": "a", "max_tokens": 400, "stream": True,
              "temperature": 0, "logit_bias": {eos: -100}}  # fmt: skip
    inputs = ["a dog", "the cat sleeps", "zwei kinder", "ein hund", "x", "park", "im", "a"]
    with serving(app) as url, httpx.stream("POST", f"{url}/v1/completions", json=stream) as s:
        lines = s.iter_lines()
        next(lines)  # the stream decodes
        vectors = httpx.post(f"{url}/v1/embeddings", json={"model": "bert", "input": inputs})
        rest = [line for line in lines if line]
    assert vectors.status_code == 200 and len(vectors.json()["data"]) == len(inputs)
    assert rest[-1] == "data: [DONE]"
    assert len(steps) == len(inputs)  # a piece each
    # between two pieces the stream took a decoding step (one job held them all before)
    assert all(b > a for a, b in itertools.pairwise(steps))
    # each vector as the encoder gives it alone, whatever piece it came in
    alone = served[1].encoder.encode(inputs[2:3])[0]
    torch.testing.assert_close(torch.tensor(vectors.json()["data"][2]["embedding"]), alone)


def test_a_plain_request_whose_client_goes_is_cancelled(served: list[Served]) -> None:
    app = create_app(served, ServeSettings(max_batch=1))  # its 8 outputs one after another
    scheduler = app.state.server.scheduler
    eos = str(served[0].model.config.eos_id)
    body = {
        "model": "gpt",
        "prompt": "a",
        "n": 8,
        "max_tokens": 512,
        "temperature": 1,
        "logit_bias": {eos: -100},
    }  # fmt: skip: 4,096 tokens unless cancelled
    with serving(app) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", json=body, timeout=0.5)
        deadline = time.monotonic() + 30
        while scheduler.running or scheduler.queued or app.state.server.in_flight:
            assert time.monotonic() < deadline, "the request went on decoding"
            time.sleep(0.05)
        tokens = scheduler.tokens
        time.sleep(0.3)
        assert scheduler.tokens == tokens < 8 * 512  # nothing decodes for it any more
        after = httpx.post(f"{url}/v1/completions", json={"model": "gpt", "prompt": "a"})
    assert after.status_code == 200


def test_an_embedding_request_whose_client_goes_stops_its_pieces(
    served: list[Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(work, "SLICE_S", 1e-12)
    monkeypatch.setattr(work, "FIRST_PIECE", 1)
    pieces = []
    original = SentenceEncoder.encode_ids

    def slow(self: SentenceEncoder, ids: list, batch_size: int = 32) -> torch.Tensor:
        pieces.append(len(ids))
        time.sleep(0.2)
        return original(self, ids, batch_size)

    monkeypatch.setattr(SentenceEncoder, "encode_ids", slow)
    app = create_app(served, ServeSettings(batch_wait_ms=0))
    with serving(app) as url:
        with pytest.raises(httpx.ReadTimeout):
            body = {"model": "bert", "input": ["a dog"] * 30}  # 6 s of pieces
            httpx.post(f"{url}/v1/embeddings", json=body, timeout=0.5)
        deadline = time.monotonic() + 10
        while app.state.server.in_flight:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)
        done = len(pieces)
    assert done < 30
