"""Hugging Face `datasets` as a corpus: a dataset saved on disk, or local json/csv/parquet/text.

`data.corpus` names one of
- a folder written by `save_to_disk` (it holds `dataset_dict.json` or `state.json`): a
  DatasetDict's splits by name, or a single Dataset as the train split;
- a folder of `{split}.jsonl|json|csv|parquet|txt` files (`.gz` too) holding the train split,
  or one such file (the train split; a lone `.txt` file is plain text, read as before).

Only local data is read: files stream through `load_dataset(<builder>, data_files=...,
streaming=True)` with downloads forbidden, and a saved dataset is memory-mapped, so no copy is
written and the rows are read lazily, a batch at a time, into the lines the text readers give.
`val` finds HF's `validation`; a source with only a train split holds out the last
`valid_fraction` of its rows for validation (the language model cuts its tokens instead, as it
does a text file's). The columns: `data.source_field`/`target_field`, else the column named
like the language, else a `translation` column of {lang: text} (wmt, opus); `data.text_field`,
else `text`. An empty value is an empty line (skipped and counted); any other value that is
not a string stops with its row.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnkit.errors import AttnkitError

if TYPE_CHECKING:
    from attnkit.data.section import DataSection

log = logging.getLogger(__name__)

_BUILDERS = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet", "txt": "text"}
_SPLIT_FILE = re.compile(r"(?P<split>.+?)\.(?P<format>jsonl|json|csv|parquet|txt)(\.gz)?")
_SAVED = ("dataset_dict.json", "state.json")
# What a Hub dataset's name looks like: `owner/name`.
_HUB_NAME = re.compile(r"[\w.-]+/[\w.-]+")
# attnkit's validation split by the name Hugging Face datasets give it.
_HF_SPLIT = {"val": "validation"}
_BATCH = 1000

# A column, and the key of its {lang: text} dicts (None: the column holds the text itself).
Field = tuple[str, str | None]


def is_dataset(d: DataSection) -> bool:
    """Whether `d.corpus` is a saved dataset, a folder of split files or one such file."""
    path = Path(d.corpus)
    if path.is_file():
        return _format(path) not in (None, "txt")
    if not path.is_dir():
        return False
    return any((path / name).is_file() for name in _SAVED) or d.train_split in _split_files(path)


def check_local(corpus: str) -> None:
    """Stop if `corpus` is no local path but reads as a Hub dataset's name."""
    if _HUB_NAME.fullmatch(corpus) and not Path(corpus).exists():
        raise AttnkitError(
            f"data.corpus {corpus!r} is not a local path, and attnkit reads only local data; "
            f"for a Hugging Face Hub dataset run datasets.load_dataset({corpus!r})"
            ".save_to_disk('FOLDER') once and set data.corpus to FOLDER"
        )


def split_text(d: DataSection, split: str, langs: Sequence[str]) -> list[list[str]]:
    """The lines of one split, one list per language (`corpus_text` for a dataset)."""
    splits = _splits(d)
    held_out = list(splits) == [d.train_split] and split in (d.train_split, d.valid_split)
    dataset, where = splits[d.train_split] if held_out else _named(d, splits, split)
    rows = list(_rows(dataset, where, [_lang_field(d, dataset, lang, where) for lang in langs]))
    if held_out:
        cut = int(len(rows) * (1 - d.valid_fraction))
        if split == d.valid_split:
            log.info(
                "%s has no %s split: its last %d rows are held out",
                d.corpus,
                split,
                len(rows) - cut,
            )
        rows = rows[:cut] if split == d.train_split else rows[cut:]
    return [[row[i] for row in rows] for i in range(len(langs))]


def train_lines(d: DataSection, *, keepends: bool = False) -> Iterator[str]:
    """The text field of the train split, a line a row (ending in a newline if `keepends`)."""
    dataset, where = _named(d, _splits(d), d.train_split)
    field = (d.text_field or "text", None)
    _check_columns(dataset, [field], where, "data.text_field")
    end = "\n" if keepends else ""
    return (text + end for (text,) in _rows(dataset, where, [field]))


def _splits(d: DataSection) -> dict[str, tuple[Any, str]]:
    """Each split's dataset, read lazily, and the words that name it in errors."""
    datasets = _import(d.corpus)
    path = Path(d.corpus)
    with _reading(d.corpus):
        if path.is_dir() and any((path / name).is_file() for name in _SAVED):
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                return {name: (part, f"split {name!r} of {path}") for name, part in loaded.items()}
            return {d.train_split: (loaded, str(path))}
        files = _split_files(path) if path.is_dir() else {d.train_split: path}
        return {split: (_stream(datasets, file), str(file)) for split, file in files.items()}


def _stream(datasets: Any, file: Path) -> Any:
    return datasets.load_dataset(
        _BUILDERS[_format(file)],
        data_files=str(file.resolve()),
        split="train",
        streaming=True,
        download_config=datasets.DownloadConfig(local_files_only=True),
    )


def _format(file: Path) -> str | None:
    """The format a file's name gives it (`jsonl` for `train.jsonl.gz`), None if none."""
    found = _SPLIT_FILE.fullmatch(file.name)
    return None if found is None else found["format"]


def _split_files(folder: Path) -> dict[str, Path]:
    files: dict[str, Path] = {}
    for file in sorted(folder.iterdir()):
        found = _SPLIT_FILE.fullmatch(file.name)
        if found is None or not file.is_file():
            continue
        split = found["split"]
        if split in files:
            raise AttnkitError(
                f"{folder} holds {files[split].name} and {file.name} for split {split!r}; "
                "keep one file per split"
            )
        files[split] = file
    return files


def _named(d: DataSection, splits: dict[str, tuple[Any, str]], split: str) -> tuple[Any, str]:
    for name in (split, _HF_SPLIT.get(split)):
        if name in splits:
            return splits[name]
    raise AttnkitError(
        f"data.corpus {d.corpus!r} has no split {split!r} (it has {', '.join(splits)}); "
        "set data.train_split and data.valid_split to its names"
    )


def _lang_field(d: DataSection, dataset: Any, lang: str, where: str) -> Field:
    """Where one language's sentences are: the field set for it, else a column named like
    it, else its key in a `translation` column."""
    option = "data.source_field" if lang == d.src_lang else "data.target_field"
    explicit = d.source_field if lang == d.src_lang else d.target_field
    if explicit:
        field: Field = (explicit, None)
    else:
        columns = _columns(dataset, where)
        field = (
            (lang, None)
            if lang in columns or "translation" not in columns
            else ("translation", lang)
        )
    _check_columns(dataset, [field], where, option)
    return field


def _columns(dataset: Any, where: str) -> list[str]:
    if dataset.column_names is not None:
        return dataset.column_names
    # A stream of csv or of a json array learns its columns only as it reads: its first row says.
    with _reading(where):
        return list(next(iter(dataset), {}))


def _check_columns(dataset: Any, fields: list[Field], where: str, option: str) -> None:
    columns = _columns(dataset, where)
    for column, _ in fields:
        if column not in columns:
            raise AttnkitError(
                f"{where} has no column {column!r} (it has {', '.join(columns) or 'none'}); "
                f"set {option} to the column that holds the text"
            )


def _rows(dataset: Any, where: str, fields: list[Field]) -> Iterator[tuple[str, ...]]:
    """Each row's texts at `fields`, read a batch at a time."""
    names = list(dict.fromkeys(column for column, _ in fields))
    number = 0
    with _reading(where):
        for batch in dataset.select_columns(names).iter(batch_size=_BATCH):
            for values in zip(*(batch[column] for column, _ in fields), strict=True):
                number += 1
                yield tuple(
                    _text(v, field, number, where) for v, field in zip(values, fields, strict=True)
                )


def _text(value: Any, field: Field, number: int, where: str) -> str:
    column, key = field
    if key is not None:
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, str):
        name = column if key is None else f"{column}[{key!r}]"
        raise AttnkitError(
            f"{where} row {number} has {value!r} in {name}, not text; drop or fill such rows "
            "(Dataset.filter, Dataset.map) and save the data again"
        )
    return value


@contextmanager
def _reading(where: str) -> Iterator[None]:
    """Say which data `datasets` failed to read, in one sentence."""
    try:
        yield
    except AttnkitError:
        raise
    except Exception as err:  # datasets and pyarrow raise many types for data they cannot parse
        raise AttnkitError(
            f"{where} could not be read by datasets ({str(err) or type(err).__name__}); "
            "fix the file or save the dataset again"
        ) from None


def _import(corpus: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise AttnkitError(
            f"data.corpus {corpus!r} is read through Hugging Face datasets, which is not "
            "installed; pip install 'attnkit[datasets]'"
        ) from None
    return datasets
