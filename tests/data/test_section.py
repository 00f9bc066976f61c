"""The [data] section and the one preparation of a run's input (`prepare_sources`): every entry
point (`attnkit translate`, `attnkit eval`, the Python API, `/v1/translate`) gives the same run
the same text, for a run trained on lowercased text and for a G2P run."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from attnkit.cli import main
from attnkit.data import cmudict
from attnkit.data.section import DataSection, lowered, prepare_sources
from attnkit.errors import AttnkitError
from attnkit.evaluation.run import evaluate_run
from attnkit.generation import GenerationConfig
from attnkit.inference import translate, translate_run
from attnkit.run import RunFolder, load_run
from attnkit.serve.app import create_app
from attnkit.serve.runs import served_runs
from tests.helpers import tiny_run

NEW_TOKENS = 6
# What a user types to each run, and what the run was trained to read for it.
TYPED = {
    "lowercase": ["EIN HUND läuft", "Zwei Kinder spielen", "the cat sleeps"],
    "g2p": ["Hello", "pronunciation", "h e l l o"],
}
READ = {
    "lowercase": ["ein hund läuft", "zwei kinder spielen", "the cat sleeps"],
    "g2p": ["h e l l o", "p r o n u n c i a t i o n", "h e l l o"],
}


@pytest.fixture(scope="module")
def lowercase_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A translation run folder whose run config says it learned from lowercased text."""
    path = tiny_run(tmp_path_factory.mktemp("lower") / "run", "encoder-decoder")
    RunFolder(path).write_run_config('[data]\ncorpus = "multi30k"\nlowercase = true\n')
    return path


@pytest.fixture
def runs(lowercase_run: Path, g2p_run: Path) -> dict[str, Path]:
    return {"lowercase": lowercase_run, "g2p": g2p_run}


def test_a_lowercasing_run_reads_lowercased_text_and_a_plain_run_text_as_it_is() -> None:
    texts = ["Ein Hund", "ÄRGER im Park"]
    assert prepare_sources(DataSection(lowercase=True), texts) == ["ein hund", "ärger im park"]
    assert prepare_sources(DataSection(corpus="multi30k"), texts) == texts
    assert lowered(DataSection(lowercase=True), texts) == ["ein hund", "ärger im park"]
    assert lowered(DataSection(), texts) == texts


def test_a_g2p_run_reads_a_word_as_its_letters_and_cmudicts_sources_as_they_are() -> None:
    g2p = DataSection(corpus="cmudict", src_lang="graphemes", tgt_lang="phonemes")
    assert prepare_sources(g2p, ["Hello", " o'Neil ", ""]) == ["h e l l o", "o ' n e i l", ""]
    sources = [source for source, _ in cmudict.entries("test")]
    assert prepare_sources(g2p, sources) == sources  # already the run's own form


def test_the_data_section_keeps_its_checks_where_it_now_lives() -> None:
    with pytest.raises(AttnkitError, match=r"data\.src_lang and data\.tgt_lang must differ"):
        DataSection(src_lang="en", tgt_lang="en")
    with pytest.raises(AttnkitError, match=r"data\.task 'poetry' is not one of translation"):
        DataSection(task="poetry")


def test_a_loaded_run_carries_the_data_section_it_was_trained_with(lowercase_run, mt_run):
    assert load_run(lowercase_run).data == DataSection(corpus="multi30k", lowercase=True)
    assert load_run(mt_run).data == DataSection()  # a run folder without a run config


@pytest.mark.parametrize("kind", ["lowercase", "g2p"])
def test_every_entry_point_gives_a_run_the_text_it_was_trained_to_read(
    kind: str, runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path, typed = runs[kind], TYPED[kind]
    run = load_run(path)
    config = GenerationConfig(max_new_tokens=NEW_TOKENS)
    expected = translate(run.model, run.tokenizer, READ[kind], config)
    # The preparation matters: the text as typed gives this model other translations.
    assert translate(run.model, run.tokenizer, typed, config) != expected

    assert translate_run(run, typed, config) == expected  # the Python API

    (tmp_path / "in.txt").write_text("".join(f"{line}\n" for line in typed))
    args = ["translate", str(path), "--input", str(tmp_path / "in.txt"), "--no-progress"]
    assert main([*args, "--max-new-tokens", str(NEW_TOKENS)]) == 0
    assert capsys.readouterr().out.splitlines() == expected  # the command line

    body = {"model": path.name, "texts": typed, "max_new_tokens": NEW_TOKENS}
    with TestClient(create_app(served_runs([str(path)]))) as client:
        served = client.post("/v1/translate", json=body).json()["translations"]
    assert [item["text"] for item in served] == expected  # the server


def test_eval_reads_a_corpus_as_the_run_reads_typed_text(lowercase_run, g2p_run, tmp_path):
    config = GenerationConfig(max_new_tokens=NEW_TOKENS)
    data = tmp_path / "data"
    (data / "multi30k").mkdir(parents=True)
    for lang, lines in (("de", TYPED["lowercase"]), ("en", READ["lowercase"])):
        with gzip.open(data / "multi30k" / f"test_2016_flickr.{lang}.gz", "wt") as f:
            f.write("".join(f"{line}\n" for line in lines))
    scored = evaluate_run(lowercase_run, config, split="test", data_dir=data)
    assert scored.hypotheses == translate_run(load_run(lowercase_run), TYPED["lowercase"], config)
    # A G2P run scores cmudict's own sources; typed as words, they translate alike.
    scored = evaluate_run(g2p_run, config, limit=5)
    words = ["".join(source.split()) for source, _ in cmudict.entries("test")[:5]]
    assert scored.hypotheses == translate_run(load_run(g2p_run), words, config)
