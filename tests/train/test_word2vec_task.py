"""The word2vec task of attnkit train: a run folder with vectors and scores, a stop and a resume
that end where an unbroken run ends, and the text it reads."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest
import torch
from gensim.models import KeyedVectors

from attnkit.embeddings.vectors import load_vectors
from attnkit.errors import AttnkitError
from attnkit.nn.embedding import TokenEmbedding
from attnkit.run import RunFolder
from attnkit.train import vector_text
from attnkit.train.run_config import RunConfig
from attnkit.train.tasks import build_task, train

# words of WordSim-353 and SimLex-999 pairs among them, so that both score
WORDS = [
    "the",
    "tiger",
    "cat",
    "sat",
    "on",
    "old",
    "new",
    "money",
    "cash",
    "while",
    "a",
    "smart",
    "intelligent",
    "dog",
    "ran",
]


def _config(tmp_path: Path, corpus: str, out: str = "run", **word2vec: object) -> RunConfig:
    return RunConfig.from_dict(
        {
            "data": {"task": "word2vec", "corpus": corpus, "lowercase": True},
            "word2vec": {"dim": 8, "min_count": 1, "epochs": 2, **word2vec},
            "train": {"out_dir": str(tmp_path / out), "threads": 1, "seed": 3},
        }
    )


@pytest.fixture
def text(tmp_path: Path) -> Path:
    g = torch.Generator().manual_seed(0)
    lines = [
        " ".join(WORDS[i] for i in torch.randint(len(WORDS), (12,), generator=g))
        for _ in range(9000)
    ]
    path = tmp_path / "text.txt"
    path.write_text("The Cat, sat!\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_run_leaves_vectors_gensim_reads_metrics_and_scores(tmp_path: Path, text: Path) -> None:
    seen: list[dict] = []
    result = train(_config(tmp_path, str(text)), callbacks=[seen.append])
    folder = RunFolder(tmp_path / "run")
    assert result.stopped == "finished" and result.step == len(seen) == 4  # 2 epochs of 108k words
    assert seen[-1]["total"] == 4 and seen[0]["epoch"] == 1 and seen[-1]["epoch"] == 2
    vectors = load_vectors(folder.vectors)
    assert sorted(vectors.words) == sorted(set(WORDS))
    assert torch.equal(vectors.vectors, result.model.vectors.inputs)
    theirs = KeyedVectors.load_word2vec_format(str(folder.vectors), binary=True)
    assert theirs.index_to_key == vectors.words
    records = folder.read_metrics()
    assert [r["step"] for r in records if "train_loss" in r] == [1, 2, 3, 4]
    assert records[-1]["wordsim353_coverage"] > 0 and "analogy" in records[-1]
    assert folder.curves.is_file() and folder.run_config.is_file()


def test_a_stopped_run_resumes_to_the_same_vectors(tmp_path: Path, text: Path) -> None:
    whole = train(_config(tmp_path, str(text), out="whole")).model.vectors.inputs

    def stop_after_the_first_step(info: dict) -> None:
        if info["step"] == 1:
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C: the step is finished and saved

    config = _config(tmp_path, str(text), out="broken")
    first = train(config, callbacks=[stop_after_the_first_step])
    assert first.stopped == "interrupted" and first.step == 1
    with pytest.raises(AttnkitError, match="already holds a run; pass --resume"):
        train(config)
    resumed = train(config, resume=True)
    assert resumed.stopped == "finished" and resumed.step == 4
    assert torch.equal(resumed.model.vectors.inputs, whole)


def test_resuming_without_a_run_or_with_other_text_says_so(tmp_path: Path, text: Path) -> None:
    config = _config(tmp_path, str(text))
    with pytest.raises(AttnkitError, match="holds no word2vec run to resume"):
        train(config, resume=True)
    train(config)
    text.write_text("other words entirely\n", encoding="utf-8")
    with pytest.raises(AttnkitError, match=r"vocabulary of .* differs"):
        train(config, resume=True)


def test_words_and_the_text_of_each_corpus(tmp_path: Path) -> None:
    assert vector_text.split_words("Don't stop, 2 cats! l’homme _x_") == [
        "Don't", "stop", "2", "cats", "l’homme", "x",
    ]  # fmt: skip
    folder = tmp_path / "parallel"
    folder.mkdir()
    (folder / "train.de").write_text("Ein Hund.\n", encoding="utf-8")
    (folder / "train.en").write_text("A dog.\n", encoding="utf-8")
    data = _config(tmp_path, str(folder)).data
    assert vector_text.sentences(data) == [["ein", "hund"], ["a", "dog"]]
    with pytest.raises(AttnkitError, match="word vectors learn from running text"):
        vector_text.sentences(_config(tmp_path, "cmudict").data)


def test_a_translation_model_starts_from_a_word2vec_runs_vectors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "parallel"
    folder.mkdir()
    for split in ("train", "val"):
        (folder / f"{split}.de").write_text("ein hund läuft\nzwei katzen\n" * 50, encoding="utf-8")
        (folder / f"{split}.en").write_text("a dog runs\ntwo cats\n" * 50, encoding="utf-8")
    vectors = train(_config(tmp_path, str(folder), out="w2v")).model.word_vectors()
    config = RunConfig.from_dict(
        {
            "model": {"d_model": 8, "n_heads": 2, "d_ff": 16, "n_encoder_layers": 1,
                      "n_decoder_layers": 1, "tie_embeddings": "all"},
            "data": {"task": "translation", "corpus": str(folder), "tokenizer": "word",
                     "vocab_size": 40, "lowercase": True},
            "train": {"out_dir": str(tmp_path / "mt"), "init_embeddings": str(tmp_path / "w2v")},
        }
    )  # fmt: skip
    # the demo quiets its parent logger
    with caplog.at_level(logging.INFO, logger="attnkit.train.run_model"):
        setup = build_task(config)
    assert "init_embeddings: 10 of 10 tokens found" in caplog.text  # every word of the text
    (table,) = {m.weight for m in setup.model.modules() if isinstance(m, TokenEmbedding)}  # tied
    row = table[setup.tokenizer.token_to_id("hund")]
    assert torch.nn.functional.cosine_similarity(row, vectors["hund"], dim=0) > 0.9999

    bad = RunConfig.from_dict({**config.to_dict(), "train": {"init_embeddings": "nowhere"}})
    with pytest.raises(AttnkitError, match="'nowhere' is neither a vector file nor"):
        build_task(bad)
    both = {"init_embeddings": str(tmp_path / "w2v"), "init_from": str(tmp_path / "w2v")}
    with pytest.raises(AttnkitError, match="unset one of them"):
        build_task(RunConfig.from_dict({**config.to_dict(), "train": both}))


def test_a_killed_run_resumes_from_its_last_save_and_records_each_step_once(
    tmp_path: Path, text: Path
) -> None:
    config = _config(tmp_path, str(text))

    def die_in_the_second_epoch(info: dict) -> None:
        if info["step"] == 3:  # after epoch 1's save at step 2, before the next
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        train(config, callbacks=[die_in_the_second_epoch])
    folder = RunFolder(tmp_path / "run")
    assert [r["step"] for r in folder.read_metrics()] == [1, 2, 3]
    assert train(config, resume=True).step == 4
    steps = [r["step"] for r in folder.read_metrics() if "train_loss" in r]
    assert steps == [1, 2, 3, 4]

    other = _config(tmp_path, str(text), window=2)
    with pytest.raises(AttnkitError, match="trained with other window; resume with the settings"):
        train(other, resume=True)
