"""A learned pooling (attention's query) is part of the run: saved with the model, loaded with
it, and used by every reader of sentence vectors (`Run.sentence_encoder`, /v1/embeddings)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors import safe_open

from attnkit.errors import AttnkitError
from attnkit.models import build_model
from attnkit.pooling import (
    POOLING_MODULE,
    Pooling,
    SentenceEncoder,
    attach_pooling,
    learned_pooling,
)
from attnkit.run import RunFolder, load_run, save_pretrained
from attnkit.serve.app import create_app
from attnkit.serve.runs import served_runs
from tests.helpers import RUN_LINES, tiny_config, tiny_run

ATTENTION = Pooling(modes=("attention",))


def attention_run(path: Path) -> tuple[Path, torch.Tensor]:
    """An encoder run whose attention pooling has a query of its own (not the mean's zero)."""
    tiny_run(path, "encoder")
    run = load_run(path)
    model = attach_pooling(run.model, ATTENTION)
    with torch.no_grad():
        model.sentence_pooling.query.copy_(torch.randn(model.config.d_model) * 3)
    run.folder.write_pooling(ATTENTION)
    save_pretrained(model, path)
    return path, model.sentence_pooling.query.detach().clone()


def test_the_query_is_saved_and_loaded_with_the_run(tmp_path: Path) -> None:
    path, query = attention_run(tmp_path / "run")
    with safe_open(str(RunFolder(path).weights), "pt") as weights:
        assert f"{POOLING_MODULE}.query" in set(weights.keys())
    run = load_run(path)
    assert torch.equal(learned_pooling(run.model).query, query)
    texts = RUN_LINES[:4]
    vectors = run.sentence_encoder().encode(texts)
    again = load_run(path).sentence_encoder().encode(texts)
    assert torch.equal(vectors, again)
    # ... and they are the query's, not the mean's it starts from
    mean = SentenceEncoder(run.model, run.tokenizer, Pooling()).encode(texts)
    assert not torch.allclose(vectors, mean, atol=1e-3)


def test_a_run_whose_pooling_lost_its_query_is_refused_in_one_sentence(tmp_path: Path) -> None:
    path = tiny_run(tmp_path / "run", "encoder")
    RunFolder(path).write_pooling(ATTENTION)  # names the mode, but no weights hold its query
    with pytest.raises(AttnkitError, match=r"missing \['sentence_pooling.query'\]"):
        load_run(path)


def test_a_learned_pooling_is_an_encoders_only() -> None:
    model = build_model(tiny_config("decoder", 1))
    with pytest.raises(AttnkitError, match="not those of a decoder model"):
        attach_pooling(model, ATTENTION)
    assert attach_pooling(model, Pooling()) is model and learned_pooling(model) is None


def test_the_embeddings_endpoint_pools_with_the_runs_query(tmp_path: Path) -> None:
    path, _ = attention_run(tmp_path / "run")
    texts = RUN_LINES[:3]
    expected = load_run(path).sentence_encoder().encode(texts)
    with TestClient(create_app(served_runs([f"run={path}"]))) as client:
        response = client.post("/v1/embeddings", json={"model": "run", "input": texts})
    assert response.status_code == 200, response.text
    got = torch.tensor([row["embedding"] for row in response.json()["data"]])
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
