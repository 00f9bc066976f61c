"""The text of a word-vector run (word2vec, GloVe): sentences of words, one a line.

`split_words` makes a line words: runs of letters and digits, an apostrophe inside
a word kept, punctuation dropped. A parallel corpus gives the lines of both
languages of `data.train_split`, so that both share one space, as they share one
vocabulary in translation; other text is read a line at a time, lower-cased if
`data.lowercase`, so that a second pass reads it again rather than holding it.
The [pretokenize] steps, if any, come between (`attnkit.pretokenize`): the
phrases are learned from the text first, one more reading for each pass.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from attnkit.data import CORPORA
from attnkit.data.hf_datasets import is_dataset
from attnkit.data.section import DataSection
from attnkit.data.sources import corpus_text, text_lines
from attnkit.errors import AttnkitError
from attnkit.pretokenize import Pretokenizer
from attnkit.run import RunFolder
from attnkit.train.run_config import RunConfig

log = logging.getLogger(__name__)

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")


def split_words(line: str) -> list[str]:
    """The words of a line: runs of letters and digits, "don't" one word, punctuation dropped."""
    return _WORD.findall(line)


def sentences(data: DataSection, pretokenizer: Pretokenizer | None = None) -> list[list[str]]:
    """The training text of `data` as sentences of words, empty lines left out; through
    `pretokenizer`'s steps if given (`attnkit.pretokenize`)."""
    return list(iter_sentences(data, pretokenizer))


def iter_sentences(
    data: DataSection, pretokenizer: Pretokenizer | None = None
) -> Iterator[list[str]]:
    """`sentences`, one at a time: a text file (or a monolingual corpus) is read as it goes,
    so that a second pass reads it again rather than holding it."""
    lines = _lines(data)
    if pretokenizer is None:
        return (words for line in lines if (words := split_words(line)))
    split = (pretokenizer.split(line, split_words) for line in lines)
    return (words for found in split if (words := pretokenizer.words(found)))


def pretokenizer_for(config: RunConfig) -> Pretokenizer | None:
    """The [pretokenize] steps of a word-vector run, its phrases learned from the text
    (which is read once more for each pass); None if none."""
    if not config.pretokenize.on:
        return None
    pretokenizer = Pretokenizer(config.pretokenize)
    if config.pretokenize.phrases:
        split = Pretokenizer(dataclasses.replace(config.pretokenize, phrases=0, stop_words="",
                                                 stem="none"), rule=pretokenizer.rule)  # fmt: skip
        pretokenizer.learn(_Reread(lambda: iter_sentences(config.data, split)))
        log.info("%d phrases learned, such as %s", len(pretokenizer.phrases),
                 ", ".join(list(pretokenizer.phrases.passes[0].scores)[:5]))  # fmt: skip
    return pretokenizer


def record_pretokenizer(folder: RunFolder, pretokenizer: Pretokenizer | None) -> None:
    """Keep the steps and phrases a word-vector run's words went through (pretokenize.json)."""
    if pretokenizer is not None:
        pretokenizer.save(folder.pretokenize)


class _Reread:
    """An iterable that reads its source afresh each time it is iterated."""

    def __init__(self, source: Callable[[], Iterator[list[str]]]) -> None:
        self.source = source

    def __iter__(self) -> Iterator[list[str]]:
        return self.source()


def _lines(data: DataSection) -> Iterable[str]:
    known = CORPORA.get(data.corpus)
    if known is not None and known.pairs is not None:
        raise AttnkitError(
            f"word vectors learn from running text, which {data.corpus} is not; use "
            "multi30k, tinyshakespeare or a text file as data.corpus"
        )
    folder = known is None and Path(data.corpus).is_dir() and not is_dataset(data)
    if (known is not None and known.langs) or folder:
        langs = (data.src_lang, data.tgt_lang)
        lines: Iterable[str] = (
            line for side in corpus_text(data, data.train_split, langs) for line in side
        )
    else:
        lines = (line.lower() if data.lowercase else line for line in text_lines(data))
    return lines
