"""attnkit serve's API through FastAPI's test client: every endpoint's answer against the library
computing the same thing alone, batching across requests, and each refusal with its status."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from attnkit.generation import GenerationConfig, generate
from attnkit.inference import translate
from attnkit.serve.app import create_app
from attnkit.serve.runs import Served, served_runs
from attnkit.serve.settings import ServeSettings
from tests.helpers import tiny_run

PROMPTS = ["a dog", "the cat sleeps", "zwei", "a", "ein hund läuft im park"]


def _client(served: list[Served], **settings: object) -> TestClient:
    return TestClient(create_app(served, ServeSettings(**settings)))


def _greedy(gpt: Served, prompt: str, new: int) -> list[int]:
    config = GenerationConfig(max_new_tokens=new, eos_token_id=gpt.tokenizer.eos_id)
    ids = gpt.tokenizer.encode(prompt)
    return generate(gpt.model, torch.tensor([ids]), config=config).new_tokens()[0]


def test_models_are_listed_and_retrieved(served: list[Served]) -> None:
    with _client(served) as client:
        models = client.get("/v1/models").json()
        one = client.get("/v1/models/mt").json()
        missing = client.get("/v1/models/nope")
    assert [m["id"] for m in models["data"]] == ["gpt", "bert", "mt"]
    assert one["id"] == "mt" and one["object"] == "model" and one["shape"] == "encoder-decoder"
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_a_completion_is_the_greedy_continuation(served: list[Served]) -> None:
    gpt = served[0]
    with _client(served) as client:
        body = {"model": "gpt", "prompt": "a dog", "max_tokens": 6, "temperature": 0}
        out = client.post("/v1/completions", json=body).json()
    expected = _greedy(gpt, "a dog", 6)
    n = len(gpt.tokenizer.encode("a dog"))
    assert out["object"] == "text_completion" and out["model"] == "gpt"
    assert out["choices"][0]["text"] == gpt.tokenizer.decode(expected)
    assert out["choices"][0]["finish_reason"] == ("length" if len(expected) == 6 else "stop")
    assert out["usage"] == {"prompt_tokens": n, "completion_tokens": len(expected),
                            "total_tokens": n + len(expected)}  # fmt: skip


def test_concurrent_requests_share_decoding_steps_and_get_what_they_get_alone(
    served: list[Served],
) -> None:
    gpt = served[0]
    app = create_app(served, ServeSettings())
    scheduler = app.state.server.scheduler

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
    expected = [gpt.tokenizer.decode(_greedy(gpt, p, 8)) for p in PROMPTS]
    assert [r["choices"][0]["text"] for r in results] == expected
    tokens = sum(r["usage"]["completion_tokens"] for r in results)
    assert scheduler.steps < tokens  # a step chose tokens of several requests
    scheduler.shutdown()


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


def test_embeddings_are_the_models_pooled_sentence_vectors(served: list[Served]) -> None:
    bert = served[1]
    with _client(served) as client:
        out = client.post(
            "/v1/embeddings", json={"model": "bert", "input": ["a dog", "the cat"]}
        ).json()
        packed = client.post(
            "/v1/embeddings",
            json={"model": "bert", "input": "a dog", "encoding_format": "base64"},
        ).json()
        ids = client.post(
            "/v1/embeddings", json={"model": "bert", "input": [bert.tokenizer.encode("a dog")]}
        ).json()
    expected = bert.encoder.encode(["a dog", "the cat"])
    got = torch.tensor([d["embedding"] for d in out["data"]])
    assert torch.allclose(got, expected, atol=1e-6) and [d["index"] for d in out["data"]] == [0, 1]
    unpacked = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    assert torch.allclose(torch.from_numpy(unpacked.copy()), expected[0], atol=1e-6)
    # token ids are the text's tokens: the model's <s> and </s> go around them, as around text
    assert torch.allclose(torch.tensor(ids["data"][0]["embedding"]), expected[0], atol=1e-6)
    with_specials = sum(len(bert.tokenizer.encode(t)) + 2 for t in ("a dog", "the cat"))
    assert out["usage"]["prompt_tokens"] == with_specials


def test_translations_are_attnkit_translates_and_n_best_comes_from_the_beam(
    served: list[Served], caplog: pytest.LogCaptureFixture
) -> None:
    mt = served[2]
    texts = ["ein hund", "", "zwei kinder spielen"]
    with _client(served) as client:
        out = client.post(
            "/v1/translate", json={"model": "mt", "texts": texts, "max_new_tokens": 6}
        ).json()
        best = client.post(
            "/v1/translate",
            json={"model": "mt", "texts": texts, "beam": 3, "n_best": 2, "max_new_tokens": 6},
        ).json()
        with caplog.at_level(logging.WARNING):
            default = client.post("/v1/translate", json={"model": "mt", "texts": ["ein hund"]})
    expected = translate(mt.model, mt.tokenizer, texts, GenerationConfig(max_new_tokens=6))
    assert [t["text"] for t in out["translations"]] == expected
    beam = translate(mt.model, mt.tokenizer, texts, GenerationConfig(max_new_tokens=6, num_beams=3))
    assert [t["text"] for t in best["translations"]] == beam
    assert all(len(t["n_best"]) == 2 for t in best["translations"])
    # max_new_tokens 128 by default, more than this model's max_len: its max_len bounds it,
    # without a warning for every ordinary request
    assert default.status_code == 200 and not caplog.records


def test_a_streamed_translation_is_the_greedy_one(served: list[Served]) -> None:
    mt = served[2]
    body = {"model": "mt", "texts": ["zwei kinder"], "max_new_tokens": 6, "stream": True}
    with _client(served) as client:
        with client.stream("POST", "/v1/translate", json=body) as response:
            lines = [line for line in response.iter_lines() if line]
        refused = client.post("/v1/translate", json={**body, "beam": 2})
    events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    text = "".join(e["choices"][0]["text"] for e in events)
    config = GenerationConfig(max_new_tokens=6)
    assert text == translate(mt.model, mt.tokenizer, ["zwei kinder"], config)[0]
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "stream"


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
    config = chosen.model.config
    layers = config.n_decoder_layers if model != "bert" else config.n_encoder_layers
    for kind, (rows, cols) in kinds.items():
        weights = torch.tensor(view["attention"][kind])
        assert weights.shape == (layers, config.n_heads, len(view["tokens"][rows]),
                                 len(view["tokens"][cols]))  # fmt: skip
        # softmax rows sum to one
        assert torch.allclose(weights.sum(-1), torch.ones(()), atol=1e-3)
    assert len(view["labels"]["keys"]) == len(view["tokens"]["keys"])
    if model != "gpt":  # the text as the model reads it, its end token included
        assert view["tokens"]["keys"][-1] in ("</s>",)
        assert view["total"]["keys"] == len(view["tokens"]["keys"])


def test_a_view_longer_than_it_shows_says_so(served: list[Served]) -> None:
    body = {"model": "gpt", "text": "ein hund läuft", "output": " a dog runs" * 6}
    with _client(served) as client:
        view = client.post("/v1/attention", json=body).json()
    shown = len(view["tokens"]["queries"])
    assert shown == served[0].max_len - 1  # the model's length bounds it here
    assert view["total"]["queries"] == len("ein hund läuft") + len(body["output"]) > shown


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


def test_concurrent_embeddings_are_each_as_alone(served: list[Served]) -> None:
    app = create_app(served, ServeSettings(batch_wait_ms=200))
    texts = ["a dog", "the cat sleeps in the park", "zwei"]

    async def alone_then_together() -> tuple[list[dict], list[dict], int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            bodies = [{"model": "bert", "input": t} for t in texts]
            alone = [(await client.post("/v1/embeddings", json=b)).json() for b in bodies]
            batches = app.state.server.batcher.batches
            responses = await asyncio.gather(
                *(client.post("/v1/embeddings", json=b) for b in bodies)
            )
            return alone, [r.json() for r in responses], batches

    alone, together, batches = asyncio.run(alone_then_together())
    for a, b in zip(alone, together, strict=True):
        assert torch.allclose(
            torch.tensor(a["data"][0]["embedding"]),
            torch.tensor(b["data"][0]["embedding"]),
            atol=1e-5,
        )
    assert app.state.server.batcher.batches == batches + 1  # all three in one batch
    app.state.server.close()


def test_the_positions_picture_is_the_models_own_method(tmp_path: Path) -> None:
    specs = [f"{kind}={tiny_run(tmp_path / kind, 'decoder', positional=kind)}"
             for kind in ("sinusoidal", "learned", "rope", "alibi")]  # fmt: skip
    with _client(served_runs(specs)) as client:
        pictures = {
            k: client.get(f"/positions.png?model={k}")
            for k in ("learned", "rope", "alibi", "sinusoidal")
        }
        missing = client.get("/positions.png?model=nope")
        icon = client.get("/favicon.ico")
    assert all(p.headers["content-type"] == "image/png" for p in pictures.values())
    assert all(p.content.startswith(b"\x89PNG") for p in pictures.values())
    assert len({p.content for p in pictures.values()}) == 4  # a picture of each method
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"


def test_the_view_shows_pieces_as_words(tmp_path: Path) -> None:
    run = tiny_run(tmp_path / "mt", "encoder-decoder", kind="bpe")
    with _client(served_runs([f"mt={run}"])) as client:
        view = client.post("/v1/attention", json={"model": "mt", "text": "ein hund läuft",
                                                   "output": "a dog runs"}).json()  # fmt: skip
    assert view["tokens"]["keys"] == ["▁ein", "▁hund", "▁läuft", "</s>"]
    assert view["labels"]["keys"] == ["ein", "hund", "läuft", "</s>"]
    assert view["labels"]["queries"] == ["<s>", "a", "dog", "runs"]


def test_a_views_translation_starts_where_decoding_does_for_a_tokenizer_without_bos(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As an imported Marian model's tokenizer has no <s>: its decoder starts on the model's
    decoder_start_id, and so do the view's queries (no bos_id to read)."""
    run = tiny_run(tmp_path / "mt", "encoder-decoder", kind="bpe")
    (served,) = served_runs([f"mt={run}"])
    kind = type(served.tokenizer)
    has = kind.has
    monkeypatch.setattr(kind, "has", lambda self, name: name != "bos" and has(self, name))
    monkeypatch.setattr(kind, "bos_id", property(lambda self: None))
    with _client([served]) as client:
        view = client.post("/v1/attention", json={"model": "mt", "text": "ein hund",
                                                   "output": "a dog"})  # fmt: skip
    start = served.model.config.decoder_start_id
    assert view.status_code == 200
    assert view.json()["tokens"]["queries"][0] == served.tokenizer.id_to_token(start)
