"""Text a user's editor or a killed run leaves behind is read, or named, never a traceback
(issue 39, POOR): a byte-order mark before a config, a corpus or a model config; a last line of
metrics.jsonl cut short by a kill or a full disk, which --resume met as a JSONDecodeError."""

from __future__ import annotations

import json
import logging

import pytest

from attnkit import AttnkitError, ModelConfig
from attnkit.files import read_lines
from attnkit.run import RunFolder
from attnkit.train import RunConfig
from tests.helpers import translation_config

BOM = b"\xef\xbb\xbf"


def test_a_byte_order_mark_is_no_text(tmp_path) -> None:
    config = translation_config(tmp_path)
    with open(config, "rb") as f:
        plain = f.read()
    with_mark = tmp_path / "bom.toml"
    with_mark.write_bytes(BOM + plain)
    assert RunConfig.load(with_mark) == RunConfig.load(config)
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(BOM + "first line\nsecond \ufeff stays\n".encode())
    for pieces in (False, True):
        assert list(read_lines(corpus, pieces=pieces)) == ["first line", "second \ufeff stays"]
    model = tmp_path / "config.json"
    model.write_bytes(BOM + ModelConfig.from_preset("tiny").to_json().encode())
    assert ModelConfig.from_json(model) == ModelConfig.from_preset("tiny")


def test_a_cut_last_line_of_metrics_is_left_out_and_a_damaged_one_named(tmp_path, caplog):
    folder = RunFolder(tmp_path)
    whole = [{"step": 2, "train_loss": 3.5}, {"step": 4, "train_loss": 3.1}]
    folder.write_metrics(whole)
    with open(folder.metrics, "a") as f:
        f.write('{"step": 6, "train_lo')
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        assert folder.read_metrics() == whole
    assert "its last line is cut short" in caplog.text
    folder.metrics.write_text('{"step": 2}\n{"step\n' + json.dumps(whole[1]) + "\n")
    with pytest.raises(AttnkitError, match=r"metrics\.jsonl, line 2 is not a JSON record"):
        folder.read_metrics()


def test_text_the_tokenizer_reads_as_unk_is_counted_in_a_warning(caplog) -> None:
    """Unknown characters became <unk> in training without a word (issue 39, POOR)."""
    from attnkit.data.datasets import LanguageModelDataset
    from attnkit.tokenizer import Tokenizer

    tokenizer = Tokenizer.train("char", texts=["abc abc abc\n"])
    lines = ["abc abc abc\n"] * 9 + ["abc xyz abc\n"]  # x, y, z: unknown, in the val split
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        LanguageModelDataset.from_lines(lines, tokenizer=tokenizer, block_size=4, split="train")
    assert "<unk>" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        LanguageModelDataset.from_lines(lines, tokenizer=tokenizer, block_size=4, split="val")
    assert "3 of the 12 tokens of the val split of the text are <unk> (25.00%)" in caplog.text
