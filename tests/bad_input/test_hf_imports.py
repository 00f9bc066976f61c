"""A Hugging Face folder's plain mistakes are one sentence (issue 53, POOR): a T5 config.json
that is a list or has `"num_heads": "4"` reached the catch-all sentence, and a tokenizer of 1
token was imported beside a 61-token T5 (translate then blamed a missing end token)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import models

from attnkit.cli import main
from bench.peers.hf_models import save_random


@pytest.fixture(scope="module")
def t5_folder(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("t5")
    save_random("t5", path)
    return path


def edited(src: Path, dst: Path, change) -> Path:
    dst.mkdir()
    for file in src.iterdir():
        (dst / file.name).write_bytes(file.read_bytes())
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(change(config)))
    return dst


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda c: [c], "config.json holds a JSON list, not an object of settings"),
        (lambda c: {**c, "num_heads": "4"}, "config.json's num_heads is '4', which should be a"),
        (lambda c: {**c, "dropout_rate": True}, "config.json's dropout_rate is True, which"),
        (lambda c: {**c, "eos_token_id": "1"}, "config.json's eos_token_id is '1', which should"),
    ],
    ids=["list", "num-heads-text", "dropout-bool", "eos-text"],
)
def test_a_config_json_of_the_wrong_shape_is_one_sentence(
    t5_folder, tmp_path, change, said, capsys
) -> None:
    folder = edited(t5_folder, tmp_path / "hf", change)
    assert main(["import", "hf", str(folder), str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and err.count("\n") == 0 and "did not expect" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("vocab", "said"),
    [
        ({"<pad>": 0}, "has 1 token, but the model's config.json names eos_token_id 1"),
        ({f"t{i}": i for i in range(80)}, "has 80 tokens, more than the 61 the model embeds"),
    ],
    ids=["one-token", "too-many"],
)
def test_a_tokenizer_that_is_not_the_models_is_refused(
    t5_folder, tmp_path, vocab, said, capsys
) -> None:
    folder = edited(t5_folder, tmp_path / "hf", lambda c: c)
    first = next(iter(vocab))
    Backend(models.WordLevel(vocab, unk_token=first)).save(str(folder / "tokenizer.json"))
    assert main(["import", "hf", str(folder), str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and "it is not this model's tokenizer" in err
    assert not (tmp_path / "run").exists()
