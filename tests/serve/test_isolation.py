"""Work that does not block other work: sentence vectors without the vocabulary projection, a
large batch of them split into pieces between the decoding steps of a running stream, so are a
long beam search and an attention view's greedy output (a few decoding steps a slice), and a
request whose client goes away cancelled with its rows freed."""

from __future__ import annotations

import itertools
import time

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from attnkit.generation import GenerationConfig, generate
from attnkit.generation.batching import Scheduler
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


def test_a_plain_request_whose_client_goes_is_cancelled(
    served: list[Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    advance = Scheduler._advance

    def paced(self: Scheduler, key: object) -> None:  # 2 ms a step at least: 4,096 steps last
        time.sleep(0.002)  # far longer than the client's 0.5 s, however fast the machine
        advance(self, key)

    monkeypatch.setattr(Scheduler, "_advance", paced)
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


@pytest.fixture
def mt_without_end(
    served: list[Served], monkeypatch: pytest.MonkeyPatch
) -> tuple[Served, list[int], object]:
    """The served encoder-decoder with its end token ruled out (so a search runs all its steps),
    the scheduler's step count noted at each of its decoding steps, and an app whose work is
    cut into the smallest slices (one step each, whatever the pace)."""
    monkeypatch.setattr(work, "SLICE_S", 1e-12)
    mt = served[2]
    app = create_app(served, ServeSettings(batch_wait_ms=0, max_new_tokens=2048))
    steps: list[int] = []
    original, eos = mt.model.decode_step, mt.model.config.eos_id

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        steps.append(app.state.server.scheduler.steps)
        logits = original(*args, **kwargs)
        logits[..., eos] = -1e9
        return logits

    monkeypatch.setattr(mt.model, "decode_step", counted)
    return mt, steps, app


def _beside_a_stream(app: object, served: list[Served], path: str, body: dict) -> httpx.Response:
    """`body` posted to `path` while a greedy stream of the decoder runs on (cancelled after:
    its 2,048 tokens outlast the work beside it)."""
    eos = str(served[0].model.config.eos_id)
    stream = {"model": "gpt", "prompt": "a", "max_tokens": 2048, "stream": True,
              "temperature": 0, "logit_bias": {eos: -100}}  # fmt: skip
    with serving(app) as url, httpx.stream("POST", f"{url}/v1/completions", json=stream) as s:
        lines = s.iter_lines()  # kept: a reader let go closes the stream, which is cancelled
        next(lines)  # the stream decodes
        return httpx.post(f"{url}{path}", json=body, timeout=60)


def test_a_long_beam_search_runs_in_slices_between_a_streams_steps(
    served: list[Served], mt_without_end: tuple
) -> None:
    mt, steps, app = mt_without_end
    body = {"model": "mt", "texts": ["zwei kinder spielen"], "beam": 4, "n_best": 2,
            "max_new_tokens": 30}  # fmt: skip
    out = _beside_a_stream(app, served, "/v1/translate", body)
    assert out.status_code == 200
    # its prefix and 29 steps (the 30th token needs none), each in a slice of its own, and
    # the stream took a decoding step between two slices (one job held them all before)
    assert len(steps) == 30
    assert all(b > a for a, b in itertools.pairwise(steps))
    # what the search found is the one-shot search's
    config = GenerationConfig(max_new_tokens=30, num_beams=4, num_return_sequences=2)
    ids = torch.tensor(mt.encode(["zwei kinder spielen"]))
    expected = mt.tokenizer.decode_batch(generate(mt.model, ids, config=config).new_tokens())
    assert out.json()["translations"][0]["n_best"] == expected


def test_an_attention_views_greedy_output_runs_in_slices_between_a_streams_steps(
    served: list[Served], mt_without_end: tuple
) -> None:
    mt, steps, app = mt_without_end
    out = _beside_a_stream(app, served, "/v1/attention", {"model": "mt", "text": "ein hund"})
    assert out.status_code == 200
    assert len(steps) == work.VIEW_TOKENS  # its prefix and 23 steps, a slice each
    assert all(b > a for a, b in itertools.pairwise(steps))
    ids = torch.tensor(mt.encode(["ein hund"]))
    config = GenerationConfig(max_new_tokens=work.VIEW_TOKENS)
    (new,) = generate(mt.model, ids, config=config).new_tokens()
    assert out.json()["text"] == mt.tokenizer.decode(new)


def test_an_attention_views_weights_are_written_out_a_layer_a_piece(served: list[Served]) -> None:
    mt = served[2]
    pieces = list(work.attention(mt, None, [("ein hund", "a dog")]))
    config = mt.model.config  # the encoder's layers, and the decoder's self- and cross-attention
    layers = config.n_encoder_layers + 2 * config.n_decoder_layers
    # the forward pass and all but the last layer give way; the last piece holds the view
    assert [len(p) for p in pieces] == [0] * layers + [1]
    ((index, view),) = pieces[-1]
    assert index == 0 and set(view["attention"]) == {"encoder", "decoder", "cross"}
