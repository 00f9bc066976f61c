"""attnkit serve's API through FastAPI's test client: every endpoint, streaming, batching across
requests (each output as it is alone), and every limit and malformed request with its status."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from attnkit.data.batch import pad
from attnkit.generation import GenerationConfig
from attnkit.inference import translate
from attnkit.pooling import sentence_embeddings
from attnkit.run import load_run
from attnkit.serve import work
from attnkit.serve.app import create_app
from attnkit.serve.settings import ServeSettings
from attnkit.serve.work import Served
from tests.helpers import tiny_run
from tests.serve.live import serving

PROMPTS = ["a dog", "the cat sleeps", "zwei", "a", "ein hund läuft im park"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> list[Served]:
    tmp = tmp_path_factory.mktemp("runs")
    runs = []
    for name, shape in (("gpt", "decoder"), ("bert", "encoder"), ("mt", "encoder-decoder")):
        run = load_run(tiny_run(tmp / name, shape))
        runs.append(Served(name, run.model, run.tokenizer))
    return runs


def _client(served: list[Served], **settings: object) -> TestClient:
    return TestClient(create_app(served, ServeSettings(**settings)))


def test_models_health_and_metrics(served: list[Served]) -> None:
    with _client(served) as client:
        models = client.get("/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["gpt", "bert", "mt"]
        assert models["data"][2]["shape"] == "encoder-decoder"
        assert client.get("/health").json() == {"status": "ok", "models": ["gpt", "bert", "mt"]}
        client.post("/v1/completions", json={"model": "gpt", "prompt": "a", "max_tokens": 3})
        text = client.get("/metrics").text
    assert 'attnkit_requests_total{path="/v1/completions",status="200"} 1' in text
    assert "attnkit_completion_tokens_total 3" in text
    assert "attnkit_batches_total 1" in text


def test_a_completion_is_the_greedy_continuation(served: list[Served]) -> None:
    gpt = served[0]
    with _client(served) as client:
        body = {"model": "gpt", "prompt": "a dog", "max_tokens": 6, "temperature": 0}
        out = client.post("/v1/completions", json=body).json()
    ids = gpt.tokenizer.encode("a dog")
    config = GenerationConfig(max_new_tokens=6, eos_token_id=gpt.tokenizer.eos_id)
    from attnkit.generation import generate

    expected = generate(gpt.model, torch.tensor([ids]), config=config).new_tokens()[0]
    assert out["object"] == "text_completion" and out["model"] == "gpt"
    assert out["choices"][0]["text"] == gpt.tokenizer.decode(expected)
    assert out["choices"][0]["finish_reason"] == ("length" if len(expected) == 6 else "stop")
    assert out["usage"] == {"prompt_tokens": len(ids), "completion_tokens": len(expected),
                            "total_tokens": len(ids) + len(expected)}  # fmt: skip


def test_concurrent_requests_share_one_decode_and_get_what_they_get_alone(
    served: list[Served],
) -> None:
    app = create_app(served, ServeSettings(batch_wait_ms=200))
    alone = {}
    with TestClient(app) as client:
        for prompt in PROMPTS:
            body = {"model": "gpt", "prompt": prompt, "max_tokens": 8, "temperature": 0}
            alone[prompt] = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    batches_before = app.state.batcher.batches

    async def together() -> list[dict]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            bodies = [
                {"model": "gpt", "prompt": p, "max_tokens": 8, "temperature": 0} for p in PROMPTS
            ]
            responses = await asyncio.gather(
                *(client.post("/v1/completions", json=b) for b in bodies)
            )
        return [r.json() for r in responses]

    results = asyncio.run(together())
    assert [r["choices"][0]["text"] for r in results] == [alone[p] for p in PROMPTS]
    assert app.state.batcher.batches == batches_before + 1  # all five in one decode


def test_streaming_sends_a_piece_an_event_then_the_finish_reason(served: list[Served]) -> None:
    with _client(served) as client:
        body = {"model": "gpt", "prompt": "a dog", "max_tokens": 5, "temperature": 0}
        whole = client.post("/v1/completions", json=body).json()["choices"][0]
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    pieces = [e["choices"][0]["text"] for e in events[:-1]]
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])
    assert events[-1]["choices"][0]["finish_reason"] == whole["finish_reason"]
    assert "".join(pieces) == whole["text"] and len(pieces) > 1


def test_embeddings_are_the_models_sentence_vectors(served: list[Served]) -> None:
    bert = served[1]
    with _client(served) as client:
        out = client.post(
            "/v1/embeddings", json={"model": "bert", "input": ["a dog", "the cat"]}
        ).json()
    ids, mask = pad([bert.tokenizer.encode(t) for t in ("a dog", "the cat")], bert.tokenizer.pad_id)
    expected = sentence_embeddings(bert.model, ids, mask)
    got = torch.tensor([d["embedding"] for d in out["data"]])
    assert torch.allclose(got, expected, atol=1e-6) and [d["index"] for d in out["data"]] == [0, 1]


def test_translations_are_attnkit_translates_and_n_best_comes_from_the_beam(
    served: list[Served],
) -> None:
    mt = served[2]
    texts = ["ein hund", "zwei kinder spielen"]
    with _client(served) as client:
        out = client.post(
            "/v1/translate", json={"model": "mt", "texts": texts, "max_new_tokens": 6}
        ).json()
        best = client.post(
            "/v1/translate",
            json={"model": "mt", "texts": texts, "beam": 3, "n_best": 2, "max_new_tokens": 6},
        ).json()
    expected = translate(mt.model, mt.tokenizer, texts, GenerationConfig(max_new_tokens=6))
    assert [t["text"] for t in out["translations"]] == expected
    beam = translate(mt.model, mt.tokenizer, texts, GenerationConfig(max_new_tokens=6, num_beams=3))
    assert [t["text"] for t in best["translations"]] == beam
    assert all(len(t["n_best"]) == 2 for t in best["translations"])


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"model": "nope", "prompt": "x"}, 404, "no model 'nope'"),
        (
            {"model": "bert", "prompt": "x"},
            400,
            "needs a decoder model, but 'bert' is an encoder one",
        ),
        ({"model": "gpt"}, 422, "prompt: Field required"),
        ({"model": "gpt", "prompt": "x", "max_tokens": 0}, 422, "max_tokens"),
        ({"model": "gpt", "prompt": "x", "max_tokens": 9999}, 400, "at most 512 new tokens"),
        ({"model": "gpt", "prompt": "x" * 60}, 400, "prompt 0 has 60 tokens; the limit is 39"),
        ({"model": "gpt", "prompt": []}, 400, "prompt must hold 1 to 64 texts, not 0"),
        ({"model": "gpt", "prompt": ["a", "b"], "stream": True}, 400, "one prompt and n = 1"),
    ],
)
def test_refusals_are_json_with_their_status(
    served: list[Served], body: dict, status: int, message: str
) -> None:
    with _client(served) as client:
        response = client.post("/v1/completions", json=body)
    assert response.status_code == status
    assert message in response.json()["error"]["message"]


def test_malformed_json_a_key_a_timeout_and_a_full_server(
    served: list[Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    with _client(served) as client:
        bad = client.post(
            "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
    with _client(served, api_key="s3cret") as client:
        assert client.get("/v1/models").status_code == 401
        assert (
            client.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        )
        assert client.get("/health").status_code == 200  # health needs no key

    def slow(served: Served, decoding: object, items: list) -> list:
        time.sleep(1.0)
        return [None] * len(items)

    monkeypatch.setattr(work, "complete", slow)
    app = create_app(served, ServeSettings(timeout_s=0.2, max_concurrent=1))
    with TestClient(app) as client:
        late = client.post("/v1/completions", json={"model": "gpt", "prompt": "a"})
        assert late.status_code == 504 and "longer than 0.2 s" in late.json()["error"]["message"]

    async def two_at_once() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            body = {"model": "gpt", "prompt": "a"}
            responses = await asyncio.gather(
                *(client.post("/v1/completions", json=body) for _ in range(2))
            )
        return sorted(r.status_code for r in responses)

    assert asyncio.run(two_at_once()) == [429, 504]


def test_a_streamed_translation_is_the_greedy_one(served: list[Served]) -> None:
    mt = served[2]
    body = {"model": "mt", "texts": ["zwei kinder"], "max_new_tokens": 6, "stream": True}
    with _client(served) as client:
        with client.stream("POST", "/v1/translate", json=body) as response:
            lines = [line for line in response.iter_lines() if line]
        refused = client.post("/v1/translate", json={**body, "beam": 2})
    events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    text = "".join(e["choices"][0]["text"] for e in events)
    assert (
        text
        == translate(mt.model, mt.tokenizer, ["zwei kinder"], GenerationConfig(max_new_tokens=6))[0]
    )
    assert refused.status_code == 400 and "one text, beam 1" in refused.json()["error"]["message"]


SELF_AND_CROSS = {
    "encoder": ("keys", "keys"), "decoder": ("queries", "queries"), "cross": ("queries", "keys"),
}  # fmt: skip


@pytest.mark.parametrize(("model", "kinds"), [
    ("mt", SELF_AND_CROSS),
    ("gpt", {"decoder": ("queries", "queries")}),
    ("bert", {"encoder": ("keys", "keys")}),
])  # fmt: skip
def test_the_attention_of_a_text_has_every_layer_head_and_token(
    served: list[Served], model: str, kinds: dict
) -> None:
    chosen = next(s for s in served if s.name == model)
    with _client(served) as client:
        view = client.post("/v1/attention", json={"model": model, "text": "ein hund"}).json()
    assert set(view["attention"]) == set(kinds)
    layers = (
        chosen.model.config.n_decoder_layers
        if model != "bert"
        else chosen.model.config.n_encoder_layers
    )
    for kind, (rows, cols) in kinds.items():
        weights = torch.tensor(view["attention"][kind])
        assert weights.shape == (layers, chosen.model.config.n_heads, len(view["tokens"][rows]),
                                 len(view["tokens"][cols]))  # fmt: skip
        # softmax rows sum to one, but for causal or padded rows there are no such
        assert torch.allclose(weights.sum(-1), torch.ones(()), atol=1e-3)
    if model == "mt":  # the source as the encoder reads it, its end token included
        assert view["tokens"]["keys"][-1] == "</s>"


def test_a_translation_can_bring_its_attention(served: list[Served]) -> None:
    body = {"model": "mt", "texts": ["ein hund", "zwei"], "max_new_tokens": 5, "attention": True}
    with _client(served) as client:
        out = client.post("/v1/translate", json=body).json()["translations"]
    mt = served[2]
    for item, text in zip(out, body["texts"], strict=True):
        source = [mt.tokenizer.id_to_token(i) for i in mt.tokenizer.encode(text, add_eos=True)]
        assert item["tokens"]["keys"] == source
        cross = torch.tensor(item["attention"]["cross"])
        assert cross.shape[-2:] == (len(item["tokens"]["queries"]), len(source))


def test_every_error_is_json_in_openais_shape(served: list[Served]) -> None:
    with _client(served, api_key="k") as client:
        key = {"Authorization": "Bearer k"}

        def post(path: str, body: dict) -> httpx.Response:
            return client.post(path, headers=key, json=body)

        gpt = {"model": "gpt", "prompt": "a"}
        for response, status in (
            (client.get("/nowhere"), 404),
            (client.get("/v1/completions", headers=key), 405),
            (client.post("/v1/completions", json=gpt), 401),
            (client.post("/v1/completions", headers={"Authorization": "Bearer no"}, json={}), 401),
            (post("/v1/embeddings", {"model": "bert", "input": ["a", ""]}), 400),
            (post("/v1/completions", {**gpt, "seed": 2**70}), 422),
            (post("/v1/completions", {**gpt, "n": 99}), 422),
        ):
            assert response.status_code == status
            assert set(response.json()["error"]) == {"message", "type", "code"}
        metrics = client.get("/metrics").text
    assert 'path="other",status="404"' in metrics and 'status="401"} 2' in metrics


def test_concurrent_embeddings_are_each_as_alone(served: list[Served]) -> None:
    app = create_app(served, ServeSettings(batch_wait_ms=200))
    texts = ["a dog", "the cat sleeps in the park", "zwei"]
    with TestClient(app) as client:
        alone = [
            client.post("/v1/embeddings", json={"model": "bert", "input": t}).json() for t in texts
        ]

    async def together() -> list[dict]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            bodies = [{"model": "bert", "input": t} for t in texts]
            return [
                r.json()
                for r in await asyncio.gather(
                    *(client.post("/v1/embeddings", json=b) for b in bodies)
                )
            ]

    for a, b in zip(alone, asyncio.run(together()), strict=True):
        assert torch.allclose(
            torch.tensor(a["data"][0]["embedding"]),
            torch.tensor(b["data"][0]["embedding"]),
            atol=1e-5,
        )


def test_a_stream_holds_its_place_and_stops_when_its_client_goes(
    served: list[Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    made = []

    def slow_stream(served: Served, decoding: object, prompt: list[int]):
        for i in range(20):
            time.sleep(0.1)
            made.append(i)
            yield "x"
        yield work.Output(["x" * 20], ["length"], len(prompt), 20)

    monkeypatch.setattr(work, "stream_completion", slow_stream)
    body = {"model": "gpt", "prompt": "a", "max_tokens": 20, "stream": True}
    app = create_app(served, ServeSettings(max_concurrent=1))
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        with client.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()  # kept: a dropped iterator closes the connection
            next(lines)
            assert httpx.get(f"{url}/v1/models").status_code == 429  # the stream holds the place
        time.sleep(1.0)
        assert len(made) < 20  # the decode stopped when the client left
        assert httpx.get(f"{url}/v1/models").status_code == 200
