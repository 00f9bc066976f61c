"""One engine behind every entry point: the same greedy tokens through Python
(`attnkit.generate`, `LLM.generate`), the command line (`attnkit generate`, `attnkit
translate`, run in-process) and HTTP (`attnkit serve`'s app), on the dynamic and the static
cache, for a language model and a translation model. Each entry point is compared with
`generate` on one prompt alone: any that drifts fails.

Every entry point on both caches is compared with the same reference (the dynamic cache's
tokens, one prompt alone), so the static cache's tokens are checked against it too; the
server's rows take the cache `attnkit serve --cache-implementation` names.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from attnkit.cli import main
from attnkit.config import COPY_ATTENTIONS
from attnkit.data.batch import pad
from attnkit.generate import generate
from attnkit.generation import LLM, GenerationConfig, paged_cache
from attnkit.generation.config import resolve
from attnkit.generation.ways import COPY, JOB, ROWS, way
from attnkit.run import Run, load_run
from attnkit.serve.app import create_app
from attnkit.serve.runs import served_runs
from attnkit.serve.settings import ServeSettings
from tests.helpers import tiny_run

NEW = 8
TEXTS = {
    "decoder": ["a dog", "the cat sleeps", "zwei"],
    "encoder-decoder": ["ein hund läuft", "zwei kinder spielen im park", "the cat"],
}
CACHES = ("dynamic", "static")
BATCH = {"dynamic": 2, "static": 3}  # rows joining later; one static shape, compiled once


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("entry")
    return {shape: tiny_run(tmp / shape, shape) for shape in TEXTS}


@pytest.fixture(scope="module")
def runs(folders: dict[str, Path]) -> dict[str, Run]:
    return {shape: load_run(folder) for shape, folder in folders.items()}


def _config(cache: str) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=NEW, cache_implementation=cache)


def _ids(run: Run, text: str) -> list[int]:
    if run.model.config.shape == "encoder-decoder":
        return run.tokenizer.encode(text, add_eos=True)
    return run.tokenizer.encode(text)


def _alone(run: Run, text: str) -> list[int]:
    """`attnkit.generate` of one prompt alone on the dynamic cache: what every entry point
    must give."""
    config = resolve(_config("dynamic"), {}, run.model.config, run.tokenizer)
    return generate(run.model, torch.tensor([_ids(run, text)]), config=config).new_tokens()[0]


def _text(run: Run, text: str, new: list[int]) -> str:
    context = _ids(run, text) if run.model.config.shape == "decoder" else []
    return run.tokenizer.decode_continuation(context, new)


@pytest.fixture(scope="module")
def expected(runs: dict[str, Run]) -> dict[str, list[list[int]]]:
    tokens = {shape: [_alone(runs[shape], text) for text in TEXTS[shape]] for shape in TEXTS}
    for new in tokens.values():
        assert any(len(one) == NEW for one in new)  # not all empty
    return tokens


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("shape", list(TEXTS))
def test_python_entry_points_give_generates_tokens(
    runs: dict[str, Run], expected: dict, shape: str, cache: str
) -> None:
    """`generate` on a batch of the prompts, and `LLM.generate`, its rows on the cache asked:
    on the dynamic one two at once, the third joining later; on the static one (paged
    memory, a step compiled a batch size: on a CPU each is a compilation) all three."""
    run, want = runs[shape], expected[shape]
    assert way(run.model.config, _config(cache)) == ROWS
    ids, mask = pad([_ids(run, t) for t in TEXTS[shape]], run.tokenizer.pad_id)
    config = resolve(_config(cache), {}, run.model.config, run.tokenizer)
    assert generate(run.model, ids, mask, config).new_tokens() == want
    with LLM(run, max_batch=BATCH[cache]) as llm:
        done = llm.generate(TEXTS[shape], _config(cache))
    assert [c.token_ids for c in done] == want
    assert [c.text for c in done] == [
        _text(run, t, new) for t, new in zip(TEXTS[shape], want, strict=True)
    ]


@pytest.mark.parametrize("cache", CACHES)
def test_attnkit_generate_prints_the_same_tokens_one_prompt_or_many(
    runs: dict[str, Run], folders: dict[str, Path], expected: dict, cache: str, capsys
) -> None:
    run, prompts = runs["decoder"], TEXTS["decoder"]
    want = [p + _text(run, p, new) for p, new in zip(prompts, expected["decoder"], strict=True)]
    common = ["--greedy", "--max-new-tokens", str(NEW), "--cache-implementation", cache]
    assert main(["generate", str(folders["decoder"]), "--prompt", prompts[0], *common]) == 0
    assert capsys.readouterr().out == want[0] + "\n"  # streamed
    many = [arg for p in prompts for arg in ("--prompt", p)]
    assert (
        main(
            ["generate", str(folders["decoder"]), *many, *common, "--batch-size", str(BATCH[cache])]
        )
        == 0
    )
    assert capsys.readouterr().out == "".join(f"{line}\n" for line in want)


@pytest.mark.parametrize("cache", CACHES)
def test_attnkit_translate_prints_the_same_tokens(
    runs: dict[str, Run],
    folders: dict[str, Path],
    expected: dict,
    cache: str,
    tmp_path: Path,
    capsys,
) -> None:
    run, sources = runs["encoder-decoder"], TEXTS["encoder-decoder"]
    lines = tmp_path / "in.txt"
    lines.write_text("".join(f"{s}\n" for s in sources), encoding="utf-8")
    folder = str(folders["encoder-decoder"])
    args = ["translate", folder, "--input", str(lines), "--no-progress", "--max-new-tokens",
            str(NEW), "--cache-implementation", cache]  # fmt: skip
    args += ["--batch-size", str(BATCH[cache])]
    assert main(args) == 0
    want = [_text(run, s, new) for s, new in zip(sources, expected["encoder-decoder"], strict=True)]
    assert capsys.readouterr().out == "".join(f"{line}\n" for line in want)


@pytest.mark.parametrize("cache", CACHES)
def test_http_gives_the_same_tokens(
    folders: dict[str, Path],
    runs: dict[str, Run],
    expected: dict,
    cache: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`attnkit serve --cache-implementation` puts a request's rows on that cache: the static
    one as paged memory (its step uncompiled here: the compiled step's tokens are checked
    above, and its recompilation in tests/generation/test_paged_cache.py)."""
    monkeypatch.setattr(paged_cache, "_compiled", lambda: paged_cache.step)
    served = served_runs([f"gpt={folders['decoder']}", f"mt={folders['encoder-decoder']}"])
    settings = ServeSettings(cache_implementation=cache, max_batch=BATCH[cache])
    app = create_app(served, settings)
    with TestClient(app) as client:
        completions = client.post(
            "/v1/completions",
            json={"model": "gpt", "prompt": TEXTS["decoder"], "max_tokens": NEW, "temperature": 0},
        ).json()
        translations = client.post(
            "/v1/translate",
            json={"model": "mt", "texts": TEXTS["encoder-decoder"], "max_new_tokens": NEW},
        ).json()
    paged = app.state.server.scheduler.paged.kept
    assert len(paged) == (2 if cache == "static" else 0)  # each model's rows on paged memory
    lm, mt = runs["decoder"], runs["encoder-decoder"]
    choices = sorted(completions["choices"], key=lambda c: c["index"])
    assert [c["text"] for c in choices] == [
        _text(lm, p, new) for p, new in zip(TEXTS["decoder"], expected["decoder"], strict=True)
    ]
    assert completions["usage"]["completion_tokens"] == sum(len(n) for n in expected["decoder"])
    assert [t["text"] for t in translations["translations"]] == [
        _text(mt, s, new)
        for s, new in zip(TEXTS["encoder-decoder"], expected["encoder-decoder"], strict=True)
    ]


def test_the_one_decision_of_how_a_request_decodes(runs: dict[str, Run]) -> None:
    """`ways.way`: greedy and sampled tokens on either cache are rows, beam search and the
    options of `generate` alone are jobs, a pointer-generator keeps its own path."""
    model = runs["encoder-decoder"].model.config
    assert way(model, GenerationConfig()) == ROWS
    assert way(model, GenerationConfig(do_sample=True, cache_implementation="static")) == ROWS
    assert way(model, GenerationConfig(num_beams=2)) == JOB
    assert way(model, GenerationConfig(do_sample=True, num_return_sequences=2)) == JOB
    assert way(model, GenerationConfig(use_cache=False)) == JOB
    assert way(model, GenerationConfig(monotonic_window=(1, 2))) == JOB
    copying = dataclasses.replace(model, copy_attention=COPY_ATTENTIONS[-1])
    assert way(copying, GenerationConfig()) == COPY
