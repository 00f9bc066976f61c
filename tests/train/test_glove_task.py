"""The GloVe task of attnkit train: a run folder with vectors and scores, a stop and a resume
that end where an unbroken run ends, and the settings it is refused with."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from gensim.models import KeyedVectors

from attnkit.embeddings.vectors import load_vectors
from attnkit.errors import AttnkitError
from attnkit.run import RunFolder
from attnkit.train.run_config import RunConfig
from attnkit.train.tasks import build_task, train

# two groups that share no context: GloVe must tell them apart
ANIMALS, MONEY = ["tiger", "cat", "dog"], ["money", "cash", "bank"]


def _config(tmp_path: Path, corpus: str, out: str = "run", **glove: object) -> RunConfig:
    return RunConfig.from_dict(
        {
            "data": {"task": "glove", "corpus": corpus, "lowercase": True},
            "glove": {"dim": 8, "min_count": 1, "window": 3, "epochs": 4, "x_max": 10.0, **glove},
            "train": {"out_dir": str(tmp_path / out), "threads": 1, "seed": 3},
        }
    )


@pytest.fixture
def text(tmp_path: Path) -> Path:
    g = torch.Generator().manual_seed(0)

    def pick(words: list[str]) -> str:
        return words[int(torch.randint(len(words), (1,), generator=g))]

    lines = []
    for _ in range(1500):
        lines.append(f"the {pick(ANIMALS)} runs and eats meat")
        lines.append(f"a {pick(MONEY)} holds gold and coins")
    path = tmp_path / "text.txt"
    path.write_text("The Cat, sat!\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_run_leaves_vectors_that_group_words_by_their_contexts(tmp_path, text) -> None:
    seen: list[dict] = []
    result = train(_config(tmp_path, str(text)), callbacks=[seen.append])
    folder = RunFolder(tmp_path / "run")
    assert result.stopped == "finished" and result.step == len(seen) == 4
    vectors = load_vectors(folder.vectors)
    assert torch.equal(vectors.vectors, result.model.params.w + result.model.params.c)
    theirs = KeyedVectors.load_word2vec_format(str(folder.vectors), binary=True)
    assert theirs.index_to_key == vectors.words
    records = folder.read_metrics()
    losses = [r["train_loss"] for r in records if "train_loss" in r]
    assert len(losses) == 4 and losses == sorted(losses, reverse=True)
    assert records[-1]["wordsim353_coverage"] > 0 and "analogy" in records[-1]
    assert folder.curves.is_file() and "[glove]" in folder.run_config.read_text()
    within = min(vectors.similarity(a, b) for group in (ANIMALS, MONEY)
                 for a in group for b in group)  # fmt: skip
    across = max(vectors.similarity(a, b) for a in ANIMALS for b in MONEY)
    assert within > across


def test_a_stopped_run_resumes_to_the_same_vectors(tmp_path: Path, text: Path) -> None:
    whole = train(_config(tmp_path, str(text), out="whole")).model.word_vectors().vectors

    def stop_after_the_first_step(info: dict) -> None:
        if info["step"] == 1:
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C: the epoch is finished and saved

    config = _config(tmp_path, str(text), out="broken")
    first = train(config, callbacks=[stop_after_the_first_step])
    assert first.stopped == "interrupted" and first.step == 1
    resumed = train(config, resume=True)
    assert resumed.stopped == "finished" and resumed.step == 4
    assert torch.equal(resumed.model.word_vectors().vectors, whole)
    steps = [r["step"] for r in RunFolder(tmp_path / "broken").read_metrics() if "train_loss" in r]
    assert steps == [1, 2, 3, 4]
    with pytest.raises(AttnkitError, match="trained with other x_max; resume with the settings"):
        train(_config(tmp_path, str(text), out="broken", x_max=5.0), resume=True)


def test_resuming_another_tasks_run_or_none_says_so(tmp_path: Path, text: Path) -> None:
    config = _config(tmp_path, str(text))
    with pytest.raises(AttnkitError, match="holds no glove run to resume"):
        train(config, resume=True)
    w2v = RunConfig.from_dict({**config.to_dict(), "data": {**config.to_dict()["data"],
                                                           "task": "word2vec"}})  # fmt: skip
    train(w2v)
    with pytest.raises(AttnkitError, match="holds a word2vec run, not glove's"):
        train(config, resume=True)


def test_glove_trains_no_transformer_and_checks_its_section(tmp_path: Path, text: Path) -> None:
    with pytest.raises(AttnkitError, match="'glove' trains word vectors, not a Transformer"):
        build_task(_config(tmp_path, str(text)))
    with pytest.raises(AttnkitError, match=r"glove\.alpha is an exponent of at most 1"):
        _config(tmp_path, str(text), alpha=1.5)
    with pytest.raises(AttnkitError, match=r"glove\.x_max must be positive"):
        _config(tmp_path, str(text), x_max=0.0)
    logged = RunConfig.from_dict({**_config(tmp_path, str(text)).to_dict(),
                                  "train": {"log_to": ["tensorboard"]}})  # fmt: skip
    with pytest.raises(AttnkitError, match="a glove run trains without it"):
        train(logged)
