"""`attnkit serve --device` and `--dtype`: the models load where and as asked, answer the same
as the library computing alone on that model, and a device this machine lacks is one sentence."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import uvicorn
from fastapi.testclient import TestClient

from attnkit.cli.main import main
from attnkit.errors import AttnkitError
from attnkit.generation import LLM, GenerationConfig, generate
from attnkit.serve.app import create_app
from attnkit.serve.runs import served_runs
from attnkit.serve.settings import ServeSettings
from tests.helpers import tiny_run


@pytest.mark.parametrize(("dtype", "expected"), [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_a_dtype_serves_the_model_in_that_type(
    tmp_path: Path, dtype: str, expected: torch.dtype
) -> None:
    runs = [f"gpt={tiny_run(tmp_path / 'gpt', 'decoder')}",
            f"bert={tiny_run(tmp_path / 'bert', 'encoder')}"]  # fmt: skip
    gpt, bert = served_runs(runs, dtype=dtype)
    assert {p.dtype for p in gpt.model.parameters()} == {expected}
    assert {p.dtype for p in bert.model.parameters()} == {expected}
    ids = gpt.tokenizer.encode("a dog")
    config = GenerationConfig(max_new_tokens=5, eos_token_id=gpt.tokenizer.eos_id)
    alone = generate(gpt.model, torch.tensor([ids]), config=config).new_tokens()[0]
    with TestClient(create_app([gpt, bert])) as client:
        body = {"model": "gpt", "prompt": "a dog", "max_tokens": 5, "temperature": 0}
        out = client.post("/v1/completions", json=body)
        vectors = client.post("/v1/embeddings", json={"model": "bert", "input": ["a dog", "x"]})
    assert out.status_code == 200
    assert out.json()["choices"][0]["text"] == gpt.tokenizer.decode(alone)
    assert vectors.status_code == 200
    assert len(vectors.json()["data"][0]["embedding"]) == bert.model.config.d_model


def test_a_dtype_with_a_compute_type_is_one_sentence(tmp_path: Path) -> None:
    run = tiny_run(tmp_path / "gpt", "decoder")
    with pytest.raises(AttnkitError, match="both choose the type"):
        served_runs([str(run)], compute_type="int8", dtype="bf16")


def test_a_device_this_machine_lacks_is_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tiny_run(tmp_path / "gpt", "decoder")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(AttnkitError, match="--device 'cuda' is not available"):
        served_runs([str(run)], device="cuda")
    # the command, where no GPU is visible (on any machine)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-m", "attnkit", "serve", str(run), "--device", "cuda", "--port", "0"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "--device 'cuda' is not available: torch finds no CUDA device on this machine; use cpu"
        )
    )
    assert "serving" not in done.stdout


def test_the_paged_pools_size_reaches_the_engine_from_the_command_and_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`attnkit serve --kv-blocks N` and `LLM(..., kv_blocks=N)` size the pool of each model's
    paged rows; 0 is one sentence."""
    run = tiny_run(tmp_path / "gpt", "decoder")
    served = served_runs([str(run)])
    app = create_app(served, ServeSettings(kv_blocks=3))
    assert app.state.server.scheduler.paged.blocks == 3
    with LLM(run, kv_blocks=5) as llm:
        assert llm.scheduler.paged.blocks == 5
    with pytest.raises(AttnkitError, match="kv_blocks must be a positive integer, got 0"):
        ServeSettings(kv_blocks=0)
    apps = []

    class Server:  # uvicorn's, which would serve until stopped: keep the app it was given
        def __init__(self, config: uvicorn.Config) -> None:
            apps.append(config.app)

        def run(self, sockets: list) -> None:
            pass

    monkeypatch.setattr(uvicorn, "Server", Server)
    assert main(["serve", str(run), "--kv-blocks", "7", "--port", "0"]) == 0
    assert apps[0].state.server.scheduler.paged.blocks == 7
