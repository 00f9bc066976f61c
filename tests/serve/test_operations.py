"""Operating the server: health and metrics outside the in-flight limit, Retry-After, bodies
refused at the door, tokenization off the event loop, request ids and the access log, CORS,
Prometheus histograms, time limits, and a stream that holds its place and stops when its client
goes."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from attnkit.generation import batching as scheduler_module
from attnkit.serve import work
from attnkit.serve.app import create_app
from attnkit.serve.runs import Served
from attnkit.serve.settings import ServeSettings
from tests.serve.live import serving

ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture
def slow_embeddings(monkeypatch: pytest.MonkeyPatch) -> None:
    original = work.embed

    def slow(served: Served, options: None, ids: list) -> list:
        time.sleep(1.0)
        return original(served, options, ids)

    monkeypatch.setattr(work, "embed", slow)


def test_health_metrics_and_the_page_answer_when_the_server_is_full(
    served: list[Served], slow_embeddings: None
) -> None:
    app = create_app(served, ServeSettings(max_concurrent=2, batch_wait_ms=0))
    body = {"model": "bert", "input": "a dog"}
    with serving(app) as url:
        post = {"json": body, "timeout": 30}
        busy = [
            threading.Thread(target=httpx.post, args=(f"{url}/v1/embeddings",), kwargs=post)
            for _ in range(2)
        ]
        for thread in busy:
            thread.start()
        deadline = time.monotonic() + 10
        while app.state.server.in_flight < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        full = httpx.post(f"{url}/v1/embeddings", json=body)
        answers = {path: httpx.get(url + path) for path in ("/health", "/ready", "/metrics", "/")}
        for thread in busy:
            thread.join()
    assert full.status_code == 429 and full.headers["retry-after"] == "1"
    assert full.json()["error"]["code"] == "rate_limit_exceeded"
    assert {p: r.status_code for p, r in answers.items()} == dict.fromkeys(answers, 200)
    assert answers["/ready"].json() == {"status": "ready", "models": ["gpt", "bert", "mt"]}


def test_a_body_over_the_limit_is_refused_at_the_door(served: list[Served]) -> None:
    app = create_app(served, ServeSettings(max_body_bytes=10_000))
    big = b'{"model": "gpt", "prompt": "' + b"x" * 20_000_000 + b'"}'
    with serving(app) as url:
        started = time.perf_counter()
        refused = httpx.post(f"{url}/v1/completions", content=big,
                             headers={"content-type": "application/json"}, timeout=30)  # fmt: skip
        seconds = time.perf_counter() - started
        fits = httpx.post(f"{url}/v1/completions", json={"model": "gpt", "prompt": "a"})
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "request_too_large"
    assert "10,000 bytes" in refused.json()["error"]["message"]
    assert fits.status_code == 200
    assert seconds < 5  # answered without reading 20 MB (tokenizing them took 49 s)

    async def chunked() -> httpx.Response:  # no Content-Length: cut off as it outgrows the limit
        async def parts():
            yield b'{"model": "gpt", "prompt": "'
            for _ in range(100):
                yield b"x" * 1000

        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/v1/completions", content=parts())

    cut = asyncio.run(chunked())
    assert cut.status_code == 413 and set(cut.json()["error"]) == ERROR_KEYS


def test_tokenizing_a_long_text_leaves_the_event_loop_free(
    served: list[Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    original = Served.encode

    def slow(self: Served, texts: list[str], truncate: bool = False) -> list[list[int]]:
        time.sleep(2.0)  # as a long text would take
        return original(self, texts, truncate)

    monkeypatch.setattr(Served, "encode", slow)
    app = create_app(served)
    with serving(app) as url:
        request = threading.Thread(
            target=httpx.post,
            args=(f"{url}/v1/completions",),
            kwargs={"json": {"model": "gpt", "prompt": "a", "max_tokens": 2}, "timeout": 30},
        )
        request.start()
        time.sleep(0.3)
        started = time.perf_counter()
        health = httpx.get(f"{url}/health")
        waited = time.perf_counter() - started
        request.join()
    assert health.status_code == 200 and waited < 1.0


def test_request_ids_and_the_access_log(
    served: list[Served], caplog: pytest.LogCaptureFixture
) -> None:
    with TestClient(create_app(served)) as client, caplog.at_level(logging.INFO, "attnkit.access"):
        mine = client.get("/v1/models", headers={"X-Request-ID": "trace-42"})
        theirs = client.get("/health")
        odd = client.get("/health", headers={"X-Request-ID": "two words"})
    assert mine.headers["x-request-id"] == "trace-42"
    for made in (theirs, odd):  # none sent, or one with a space: a new one
        assert len(made.headers["x-request-id"]) == 32 and " " not in made.headers["x-request-id"]
    lines = [r.getMessage() for r in caplog.records if r.name == "attnkit.access"]
    assert len(lines) == 3
    assert '"GET /v1/models" 200' in lines[0] and lines[0].endswith("id=trace-42")
    with TestClient(create_app(served, ServeSettings(access_log=False))) as client:
        caplog.clear()
        client.get("/health")
    assert not [r for r in caplog.records if r.name == "attnkit.access"]


def test_cors_lets_the_named_origins_in(served: list[Served]) -> None:
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}  # fmt: skip
    settings = ServeSettings(cors_origins=("https://app.example",), api_key="k")
    with TestClient(create_app(served, settings)) as client:
        allowed = client.options("/v1/completions", headers=preflight)
        other = client.options("/v1/completions", headers={**preflight, "Origin": "https://x.y"})
        answer = client.get("/v1/models", headers={"Origin": "https://app.example",
                                                   "Authorization": "Bearer k"})  # fmt: skip
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    assert "access-control-allow-origin" not in other.headers
    assert answer.headers["access-control-allow-origin"] == "https://app.example"
    with TestClient(create_app(served)) as client:
        plain = client.get("/v1/models", headers={"Origin": "https://app.example"})
    assert "access-control-allow-origin" not in plain.headers


def test_metrics_have_histograms_of_latency_and_first_tokens(served: list[Served]) -> None:
    with TestClient(create_app(served)) as client:
        body = {"model": "gpt", "prompt": "a", "max_tokens": 3, "temperature": 0}
        client.post("/v1/completions", json=body)
        client.post("/v1/completions", json={**body, "stream": True})
        text = client.get("/metrics").text
    assert "# HELP attnkit_request_duration_seconds" in text
    assert 'attnkit_requests_total{path="/v1/completions",status="200"} 2.0' in text
    assert 'attnkit_request_duration_seconds_count{model="gpt",path="/v1/completions"} 2.0' in text
    assert "attnkit_time_to_first_token_seconds_count 2.0" in text
    assert 'attnkit_completion_tokens_total{model="gpt"} 6.0' in text
    gauges = ("attnkit_queue_length", "attnkit_running_rows",
              "attnkit_generation_tokens_per_second", "attnkit_requests_in_flight")  # fmt: skip
    for gauge in gauges:
        assert f"# TYPE {gauge} gauge" in text


def test_errors_are_json_in_openais_shape(served: list[Served], slow_embeddings: None) -> None:
    with TestClient(create_app(served, ServeSettings(api_key="k"))) as client:
        key = {"Authorization": "Bearer k"}
        for response, status in (
            (client.get("/nowhere"), 404),
            (client.get("/v1/completions", headers=key), 405),
            (client.post("/v1/completions", json={"model": "gpt", "prompt": "a"}), 401),
            (client.post("/v1/completions", headers=key, content=b"{not json"), 400),
        ):
            assert response.status_code == status, response.text
            assert set(response.json()["error"]) == ERROR_KEYS
        metrics = client.get("/metrics").text
    assert 'path="other",status="404"' in metrics
    app = create_app(served, ServeSettings(timeout_s=0.2, batch_wait_ms=0))
    with TestClient(app) as client:
        late = client.post("/v1/embeddings", json={"model": "bert", "input": "a"})
    assert late.status_code == 504 and late.json()["error"]["code"] == "timeout"


def test_a_stream_holds_its_place_and_stops_when_its_client_goes(
    served: list[Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = []
    choose = scheduler_module.choose

    def slow(logits: torch.Tensor, rows: list) -> list:
        time.sleep(0.1)
        steps.append(len(rows))
        return choose(logits, rows)

    monkeypatch.setattr(scheduler_module, "choose", slow)
    body = {"model": "gpt", "prompt": "a", "max_tokens": 40, "stream": True}
    app = create_app(served, ServeSettings(max_concurrent=1))
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        with client.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()  # kept: a dropped iterator closes the connection
            next(lines)
            assert httpx.get(f"{url}/v1/models").status_code == 429  # the stream holds the place
        time.sleep(1.0)
        made = len(steps)
        time.sleep(0.5)
        assert len(steps) == made < 40  # the row left the batch when its client left
        assert httpx.get(f"{url}/v1/models").status_code == 200
