"""The server speaks its clients' conventions: an OpenAPI schema and its page, CORS that lets
OpenAI's JavaScript client call from an allowed origin (a preflight, and Chromium), counters
typed as counters, process metrics, time to first token from the request's arrival, a model
label on latency, the served limit in /v1/models, times in the access log, and a lifespan
that stops the decoding thread."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.testclient import TestClient
from playwright.sync_api import sync_playwright

from attnkit.pooling import Pooling
from attnkit.run import RunFolder
from attnkit.serve.app import create_app
from attnkit.serve.runs import Served, served_runs
from attnkit.serve.settings import ServeSettings
from tests.helpers import BROWSER_FLAGS, CHROMIUM, tiny_run
from tests.serve.live import serving

# what openai-node sends beside the request's own headers (its x-stainless-* fingerprint)
STAINLESS = {
    "x-stainless-lang": "js",
    "x-stainless-package-version": "5.23.0",
    "x-stainless-os": "Linux",
    "x-stainless-arch": "x64",
    "x-stainless-runtime": "browser:chrome",
    "x-stainless-runtime-version": "140.0.0",
    "x-stainless-retry-count": "0",
    "x-stainless-timeout": "600",
}


def test_the_openapi_schema_and_its_page(served: list[Served]) -> None:
    with TestClient(create_app(served, ServeSettings(api_key="k"))) as client:
        schema = client.get("/openapi.json")
        page = client.get("/docs")
    assert schema.status_code == 200 and page.status_code == 200  # no key: they are public
    paths = schema.json()["paths"]
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models",
                 "/v1/translate", "/v1/attention", "/health", "/metrics"):  # fmt: skip
        assert path in paths
    assert (
        "temperature" in schema.json()["components"]["schemas"]["CompletionRequest"]["properties"]
    )
    assert "swagger-ui" in page.text and "/openapi.json" in page.text


def test_a_preflight_of_openais_javascript_client_is_let_in(served: list[Served]) -> None:
    asked = ",".join(["authorization", "content-type", *STAINLESS])
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": asked}  # fmt: skip
    settings = ServeSettings(cors_origins=("https://app.example",))
    with TestClient(create_app(served, settings)) as client:
        allowed = client.options("/v1/chat/completions", headers=preflight)
        other = client.options("/v1/chat/completions", headers={**preflight, "Origin": "https://x"})
    assert allowed.status_code == 200
    let_in = {h.strip() for h in allowed.headers["access-control-allow-headers"].split(",")}
    assert set(STAINLESS) | {"authorization", "content-type"} <= let_in
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


def test_a_browser_page_from_an_allowed_origin_calls_the_api(served: list[Served]) -> None:
    assert Path(CHROMIUM).is_file(), "Chromium is missing: apt-get install chromium"
    site = FastAPI()
    site.get("/", response_class=HTMLResponse)(lambda: "<!doctype html><title>app</title>")
    call = """async ([url, headers]) => {
        const answer = await fetch(url + "/v1/chat/completions", {method: "POST",
            headers: {...headers, "Authorization": "Bearer k", "Content-Type": "application/json"},
            body: JSON.stringify({model: "gpt", max_tokens: 3, temperature: 0,
                                  messages: [{role: "user", content: "a dog"}]})});
        return [answer.status, await answer.json()];
    }"""
    with serving(site) as origin:
        settings = ServeSettings(cors_origins=(origin,), api_key="k")
        with serving(create_app(served, settings)) as api, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_FLAGS)
            try:
                page = browser.new_page()
                page.goto(origin + "/")
                status, body = page.evaluate(call, [api, STAINLESS])
                # a page of another origin is refused by the browser itself
                closed = create_app(served, ServeSettings(api_key="k"))
                with serving(closed) as elsewhere:
                    refused = page.evaluate(
                        "async ([u, h]) => { try { await fetch(u + '/v1/models', {headers: h});"
                        " return 'fetched'; } catch (e) { return 'refused'; } }",
                        [elsewhere, STAINLESS],
                    )
            finally:
                browser.close()
    assert status == 200 and body["object"] == "chat.completion"
    assert refused == "refused"


def test_metrics_are_typed_and_labelled(
    served: list[Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    original = Served.encode

    def slow(self: Served, texts: list, truncate: bool = False) -> list[list[int]]:
        time.sleep(0.3)  # tokenizing takes its time: the first token counts it
        return original(self, texts, truncate)

    monkeypatch.setattr(Served, "encode", slow)
    with TestClient(create_app(served)) as client:
        body = {"model": "gpt", "prompt": "a", "max_tokens": 3, "temperature": 0}
        client.post("/v1/completions", json=body)
        client.post("/v1/embeddings", json={"model": "bert", "input": "a dog"})
        client.post("/v1/completions", json={**body, "model": "nope"})
        text = client.get("/metrics").text
    for counter in ("attnkit_decode_steps", "attnkit_batches", "attnkit_batched_requests"):
        assert f"# TYPE {counter}_total counter" in text
        assert re.search(rf"^{counter}_total [1-9]", text, re.M), counter
    assert "# TYPE process_cpu_seconds_total counter" in text
    assert "process_resident_memory_bytes" in text
    assert 'attnkit_request_duration_seconds_count{model="gpt",path="/v1/completions"} 1.0' in text
    assert 'model="bert",path="/v1/embeddings"' in text
    assert 'model="nope"' not in text  # a name the server lacks makes no series
    first = float(re.search(r"attnkit_time_to_first_token_seconds_sum (\S+)", text)[1])
    assert first >= 0.3  # from the request's arrival, tokenizing included


def test_models_say_the_limit_served(tmp_path: Path) -> None:
    bert = tiny_run(tmp_path / "bert", "encoder", max_len=40)
    RunFolder(bert).pooling.write_text(Pooling(max_tokens=16).to_json())
    gpt = tiny_run(tmp_path / "gpt", "decoder", max_len=40)
    settings = ServeSettings(max_input_tokens=30)
    with TestClient(create_app(served_runs([str(bert), str(gpt)]), settings)) as client:
        cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert cards["bert"]["max_model_len"] == 16  # its pooling cuts at 16, not its max_len 40
    assert cards["bert"]["max_input_tokens"] == 16
    assert cards["gpt"]["max_model_len"] == 40 and cards["gpt"]["max_input_tokens"] == 30


def test_the_access_log_has_times_and_the_lifespan_stops_decoding(
    served: list[Served], caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(served)
    with TestClient(app) as client, caplog.at_level(logging.INFO, "attnkit.access"):
        client.get("/health")
        assert app.state.server.scheduler.thread.is_alive()
    (line,) = [r.getMessage() for r in caplog.records if r.name == "attnkit.access"]
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z testclient \"GET /health\" 200 ", line)
    assert app.state.server.draining  # the lifespan's end closed it
    app.state.server.scheduler.thread.join(timeout=10)
    assert not app.state.server.scheduler.thread.is_alive()
