"""A completion's text over HTTP is what the tokenizer decodes prompt and continuation to,
less the prompt (issue 54), whole and streamed: decoded alone, a word-level or BPE
continuation lost the space before its first word. One served run per tokenizer kind."""

from __future__ import annotations

import json

import pytest
import torch
from fastapi.testclient import TestClient

from attnkit.generation import GenerationConfig, generate
from attnkit.serve.app import create_app
from attnkit.serve.runs import Served, served_runs
from attnkit.serve.settings import ServeSettings
from tests.helpers import tiny_run

KINDS = ("char", "word", "bpe", "byte-bpe")
PROMPT = "the cat"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Served]:
    tmp = tmp_path_factory.mktemp("runs")
    runs = served_runs([f"{kind}={tiny_run(tmp / kind, 'decoder', kind=kind)}" for kind in KINDS])
    return dict(zip(KINDS, runs, strict=True))


def expected_text(run: Served, new: int) -> str:
    """decode(prompt + continuation) less decode(prompt), the continuation greedy."""
    tokenizer = run.tokenizer
    config = GenerationConfig(max_new_tokens=new, eos_token_id=tokenizer.eos_id)
    ids = tokenizer.encode(PROMPT)
    out = generate(run.model, torch.tensor([ids]), config=config).new_tokens()[0]
    assert tokenizer.decode(ids) == PROMPT and out  # the test's own premise
    return tokenizer.decode(ids + out)[len(PROMPT) :]


@pytest.mark.parametrize("kind", KINDS)
def test_a_completion_continues_its_prompt_as_decoded_together(served, kind) -> None:
    expected = expected_text(served[kind], 6)
    body = {"model": kind, "prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    with TestClient(create_app(list(served.values()), ServeSettings())) as client:
        whole = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
            lines = [line for line in response.iter_lines() if line.startswith("data: {")]
    pieces = [json.loads(line.removeprefix("data: "))["choices"][0]["text"] for line in lines]
    assert whole == expected and "".join(pieces) == expected
    if kind in ("word", "bpe"):  # the decoders that put a space between words, not before one
        assert expected.startswith(" ")
