"""Hugging Face `datasets` as a corpus: the same batches as the same text in files, bad rows
stopped with their row, nothing but local data read."""

from __future__ import annotations

import gzip
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attnkit.data.sources import corpus_text, text_lines
from attnkit.errors import AttnkitError
from attnkit.train.run_config import RunConfig
from attnkit.train.tasks import build_task

TINY = {"d_model": 16, "n_heads": 2, "d_ff": 32, "max_len": 64}
MT_MODEL = {**TINY, "n_encoder_layers": 1, "n_decoder_layers": 1}
LM_MODEL = {"preset": "gpt-tiny", **TINY, "n_decoder_layers": 1}


def head(path: Path, n: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [line.rstrip("\n") for line in itertools.islice(lines, n)]


@pytest.fixture(scope="module")
def multi30k(samples: Path) -> dict[str, dict[str, list[str]]]:
    """300 training and 40 validation pairs of Multi30k, one training pair empty on both sides."""
    folder = samples / "multi30k"
    splits = {
        split: {lang: head(folder / f"{split}.{lang}.gz", n) for lang in ("de", "en")}
        for split, n in (("train", 300), ("val", 40))
    }
    splits["train"]["de"][7] = splits["train"]["en"][7] = ""
    return splits


def write_text_files(folder: Path, splits: dict[str, dict[str, list[str]]]) -> Path:
    folder.mkdir()
    for split, sides in splits.items():
        for lang, lines in sides.items():
            (folder / f"{split}.{lang}").write_text("".join(f"{line}\n" for line in lines))
    return folder


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def saved_translation(folder: Path, splits: dict[str, dict[str, list[str]]]) -> dict[str, Any]:
    """A DatasetDict as wmt/opus give them: a `translation` column, `validation` for val."""
    parts = {
        "validation" if split == "val" else split: datasets.Dataset.from_dict(
            {"translation": [{"de": s, "en": t} for s, t in zip(*sides.values(), strict=True)]}
        )
        for split, sides in splits.items()
    }
    datasets.DatasetDict(parts).save_to_disk(str(folder))
    return {}


def jsonl_named_fields(folder: Path, splits: dict[str, dict[str, list[str]]]) -> dict[str, Any]:
    folder.mkdir()
    for split, sides in splits.items():
        pairs = zip(sides["de"], sides["en"], strict=True)
        write_jsonl(
            folder / f"{split}.jsonl",
            [{"id": i, "src": s, "tgt": t} for i, (s, t) in enumerate(pairs)],
        )
    return {"source_field": "src", "target_field": "tgt"}


def parquet_lang_columns(folder: Path, splits: dict[str, dict[str, list[str]]]) -> dict[str, Any]:
    folder.mkdir()
    for split, sides in splits.items():
        pq.write_table(pa.table(sides), folder / f"{split}.parquet")
    return {}


def setup_of(tmp_path: Path, model: dict[str, Any], data: dict[str, Any]) -> Any:
    config = RunConfig.from_dict(
        {"model": model, "data": data, "train": {"out_dir": str(tmp_path / "run"), "threads": 1}}
    )
    return build_task(config)


def batches(loader: Any) -> list[list[Any]]:
    return [[batch.src, batch.src_mask, batch.tgt, batch.tgt_mask] for batch in loader]


def assert_same_batches(a: Any, b: Any) -> None:
    for loader_a, loader_b in ((a.train_data, b.train_data), (a.val_data, b.val_data)):
        got, expected = batches(loader_a), batches(loader_b)
        assert len(got) == len(expected) > 0
        for tensors_a, tensors_b in zip(got, expected, strict=True):
            for x, y in zip(tensors_a, tensors_b, strict=True):
                assert (x is None and y is None) or (x.shape == y.shape and bool((x == y).all()))


@pytest.mark.parametrize("write", [saved_translation, jsonl_named_fields, parquet_lang_columns])
def test_translation_batches_from_a_dataset_equal_those_from_text_files(tmp_path, multi30k, write):
    data = {"task": "translation", "tokenizer": "bpe", "vocab_size": 300, "max_tokens": 400}
    as_text = write_text_files(tmp_path / "text", multi30k)
    fields = write(tmp_path / "dataset", multi30k)
    expected = setup_of(tmp_path / "a", MT_MODEL, {**data, "corpus": str(as_text)})
    got = setup_of(
        tmp_path / "b", MT_MODEL, {**data, "corpus": str(tmp_path / "dataset"), **fields}
    )
    assert got.tokenizer.backend.get_vocab() == expected.tokenizer.backend.get_vocab()
    assert_same_batches(got, expected)
    # The empty pair and the long ones are skipped and counted, as the text files' are.
    skipped = got.train_data.dataset.skipped
    assert skipped == expected.train_data.dataset.skipped and skipped["empty"] == 1


def lm_saved(folder: Path, lines: list[str]) -> Path:
    datasets.Dataset.from_dict({"text": lines}).save_to_disk(str(folder))
    return folder


def lm_txt_folder(folder: Path, lines: list[str]) -> Path:
    folder.mkdir()
    (folder / "train.txt").write_text("".join(f"{line}\n" for line in lines))
    return folder


def lm_jsonl_gz(folder: Path, lines: list[str]) -> Path:
    folder.mkdir()
    path = folder / "corpus.jsonl.gz"
    path.write_bytes(gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in lines).encode()))
    return path


@pytest.mark.parametrize(
    ("write", "kind"), [(lm_saved, "char"), (lm_txt_folder, "byte-bpe"), (lm_jsonl_gz, "char")]
)
def test_language_model_batches_from_a_dataset_equal_those_from_a_text_file(
    tmp_path, samples, write, kind
):
    lines = head(samples / "multi30k" / "train.en.gz", 200)
    lines[3] = ""  # an empty line is content in running text, in both
    text = tmp_path / "text.txt"
    text.write_text("".join(f"{line}\n" for line in lines))
    corpus = write(tmp_path / "dataset", lines)
    data = {
        "task": "language-model",
        "tokenizer": kind,
        "vocab_size": 300,
        "block_size": 32,
        "batch_size": 8,
    }
    expected = setup_of(tmp_path / "a", LM_MODEL, {**data, "corpus": str(text)})
    got = setup_of(tmp_path / "b", LM_MODEL, {**data, "corpus": str(corpus)})
    assert got.tokenizer.backend.get_vocab() == expected.tokenizer.backend.get_vocab()
    assert_same_batches(got, expected)


def data_section(corpus: Path, **data: Any) -> Any:
    return RunConfig.from_dict({"data": {"corpus": str(corpus), **data}}).data


def test_a_source_with_only_a_train_split_holds_out_its_last_rows(tmp_path):
    rows = [{"de": f"satz {i}", "en": f"sentence {i}"} for i in range(20)]
    datasets.Dataset.from_dict({"translation": rows}).save_to_disk(str(tmp_path / "saved"))
    d = data_section(tmp_path / "saved", valid_fraction=0.25, lowercase=True)
    train, val = (corpus_text(d, split, ("en", "de")) for split in ("train", "val"))
    assert train == [[f"sentence {i}" for i in range(15)], [f"satz {i}" for i in range(15)]]
    assert val == [[f"sentence {i}" for i in range(15, 20)], [f"satz {i}" for i in range(15, 20)]]


def test_val_finds_the_validation_split_and_a_missing_split_names_those_there(tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [{"de": "a", "en": "b"}])
    write_jsonl(folder / "validation.jsonl", [{"de": "c", "en": "d"}])
    d = data_section(folder)
    assert corpus_text(d, "val", ("de", "en")) == [["c"], ["d"]]
    with pytest.raises(AttnkitError, match=r"has no split 'test' \(it has train, validation\)"):
        corpus_text(d, "test", ("de", "en"))


@pytest.mark.parametrize(
    ("row", "found"),
    [
        ({"de": None, "en": "b"}, r"row 3 has None in de, not text"),
        ({"de": 7, "en": "b"}, r"row 3 has 7 in de, not text"),
    ],
)
def test_a_value_that_is_not_text_stops_with_its_row(tmp_path, row, found):
    rows = [{"de": "a", "en": "b"}, {"de": "", "en": ""}, row]
    path = write_jsonl(tmp_path / "pairs.jsonl", rows)
    with pytest.raises(AttnkitError, match=f"{path} {found}; drop or fill such rows"):
        corpus_text(data_section(path, valid_fraction=0.5), "train", ("de", "en"))


def test_a_translation_without_the_language_stops_with_its_row(tmp_path):
    rows = [{"translation": {"de": "a", "en": "b"}}, {"translation": {"de": "c", "fr": "d"}}]
    path = write_jsonl(tmp_path / "pairs.jsonl", rows)
    d = data_section(path, valid_fraction=0.5)
    with pytest.raises(AttnkitError, match=r"row 2 has None in translation\['en'\]"):
        corpus_text(d, "val", ("de", "en"))


def test_a_missing_column_names_the_columns_there(tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", [{"german": "a", "english": "b"}])
    with pytest.raises(
        AttnkitError, match=r"no column 'de' \(it has german, english\); set data.source_field"
    ):
        corpus_text(data_section(path), "train", ("de", "en"))
    with pytest.raises(AttnkitError, match=r"no column 'story' .*; set data.text_field"):
        text_lines(data_section(path, text_field="story"))


def test_a_file_datasets_cannot_parse_is_named(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"de": "a", "en": "b"}\n{"de": oops\n')
    with pytest.raises(
        AttnkitError, match=f"{path} could not be read by datasets .*JSON parse error"
    ):
        corpus_text(data_section(path), "train", ("de", "en"))


def test_a_hub_name_is_refused_with_how_to_save_it_locally(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = RunConfig.from_dict({"data": {"corpus": "wmt/wmt14"}}).data
    with pytest.raises(AttnkitError, match=r"reads only local data; .*\.save_to_disk\('FOLDER'\)"):
        corpus_text(d, "train", ("de", "en"))


def test_without_the_datasets_package_the_error_says_what_to_install(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "pairs.jsonl", [{"de": "a", "en": "b"}])
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(AttnkitError, match=r"pip install 'attnkit\[datasets\]'"):
        corpus_text(data_section(path), "train", ("de", "en"))


def test_local_files_are_streamed_without_an_arrow_copy(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    path = write_jsonl(
        tmp_path / "pairs.jsonl", [{"de": f"a{i}", "en": f"b{i}"} for i in range(10)]
    )
    assert corpus_text(data_section(path), "train", ("de", "en"))[0] == [f"a{i}" for i in range(9)]
    assert not list(cache.rglob("*.arrow"))


def test_fields_set_for_a_corpus_that_is_no_dataset_are_refused(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("some text\n" * 10)
    config = RunConfig.from_dict(
        {
            "model": LM_MODEL,
            "data": {"task": "language-model", "corpus": str(text), "text_field": "body"},
        }
    )
    with pytest.raises(AttnkitError, match=r"data\.text_field name columns of a dataset"):
        build_task(config)


def test_a_masked_lm_reads_a_saved_datasets_text_as_it_reads_a_text_file(tmp_path, samples):
    """A dataset folder is no folder of {split}.{lang} files: its text field is the text."""
    lines = head(samples / "multi30k" / "train.en.gz", 200)
    text = tmp_path / "text.txt"
    text.write_text("".join(f"{line}\n" for line in lines))
    corpus = lm_saved(tmp_path / "dataset", lines)
    model = {"preset": "bert-mini", **TINY, "n_encoder_layers": 1}
    data = {"task": "masked-lm", "tokenizer": "char", "vocab_size": 300}
    expected = setup_of(tmp_path / "a", model, {**data, "corpus": str(text)})
    got = setup_of(tmp_path / "b", model, {**data, "corpus": str(corpus)})
    assert_same_batches(got, expected)
