"""What one request may ask: a budget of new tokens in all, no empty token list, and n
outputs with a seed that differ from each other and are the same again (choice i seeded from
(seed, i)), best_of's and /v1/translate's n_best too."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from attnkit.serve.app import create_app
from attnkit.serve.runs import Served
from attnkit.serve.settings import ServeSettings


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"model": "gpt", "prompt": ["a", "b", "c"], "n": 4,
                             "max_tokens": 10}, "max_tokens"),
        ("/v1/completions", {"model": "gpt", "prompt": "a", "n": 1, "best_of": 11,
                             "max_tokens": 10}, "max_tokens"),
        ("/v1/chat/completions", {"model": "gpt", "messages": [{"role": "user", "content": "a"}],
                                  "n": 2, "max_tokens": 60}, "max_tokens"),
        ("/v1/translate", {"model": "mt", "texts": ["a dog", "zwei"], "beam": 4,
                           "max_new_tokens": 20}, "max_new_tokens"),
    ],
)  # fmt: skip
def test_a_request_over_the_token_budget_is_a_400_naming_it(
    served: list[Served], path: str, body: dict, param: str
) -> None:
    with TestClient(create_app(served, ServeSettings(max_request_tokens=100))) as client:
        refused = client.post(path, json=body)
        fits = client.post(path, json={**body, param: 2})
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["param"] == param
    assert error["code"] == "request_too_large"
    assert "max_request_tokens of 100 (--max-request-tokens, default 65,536)" in error["message"]
    assert fits.status_code == 200


@pytest.mark.parametrize("prompt", [[[]], [[3, 4], []]])
def test_an_empty_token_list_is_a_400(served: list[Served], prompt: list) -> None:
    with TestClient(create_app(served)) as client:
        out = client.post("/v1/completions", json={"model": "gpt", "prompt": prompt})
        vectors = client.post("/v1/embeddings", json={"model": "bert", "input": prompt})
    for answer in (out, vectors):
        assert answer.status_code == 400
        assert "is an empty list of token ids" in answer.json()["error"]["message"]
    assert out.json()["error"]["param"] == "prompt"


def _texts(client: TestClient, path: str, body: dict) -> list[str]:
    answer = client.post(path, json=body)
    assert answer.status_code == 200, answer.text
    if path == "/v1/translate":
        return answer.json()["translations"][0]["n_best"]
    return [c["text"] for c in answer.json()["choices"]]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"model": "gpt", "prompt": "a", "n": 4}),
        ("/v1/completions", {"model": "gpt", "prompt": "a", "n": 2, "best_of": 4}),
        ("/v1/translate", {"model": "mt", "texts": ["a dog"], "sample": True, "n_best": 4}),
    ],
)
def test_n_outputs_with_a_seed_differ_and_come_again(
    served: list[Served], path: str, body: dict
) -> None:
    length = {"max_new_tokens": 12} if path == "/v1/translate" else {"max_tokens": 12}
    seeded = {**body, **length, "temperature": 1.0, "seed": 7}
    with TestClient(create_app(served)) as client:
        first = _texts(client, path, seeded)
        again = _texts(client, path, seeded)
        other = _texts(client, path, {**seeded, "seed": 8})
        if "best_of" not in body:  # the first output draws as one output of that seed does
            n_key = "n_best" if path == "/v1/translate" else "n"
            (alone,) = _texts(client, path, {**seeded, n_key: 1})
            assert alone == first[0]
    assert first == again
    assert len(set(first)) == len(first)  # every output its own draws
    assert other != first
