"""Word segmentation of text written without spaces between words (Chinese), by jieba.

jieba (the segmenter Chinese users know: a prefix dictionary of about 350,000
words, the most probable path through the sentence's word graph by dynamic
programming, and an HMM for words outside the dictionary) cuts
"我爱北京天安门" into 我 / 爱 / 北京 / 天安门. Its words are passed on unchanged;
the spaces between them are dropped, as the words of the rest of attnkit carry no
spaces. `join_segmented` puts a space between words where jieba found none, so
that a subword tokenizer sees the words; `unjoin` takes such spaces back out
between two CJK characters, for decoding.
"""

from __future__ import annotations

import functools
import logging
import re
from types import ModuleType

from attnkit.errors import AttnkitError

SEGMENTERS = ("none", "jieba")
# A space between two characters of the CJK blocks (ideographs, kana, hangul, their punctuation).
_CJK = r"\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
_BETWEEN_CJK = re.compile(rf"(?<=[{_CJK}]) (?=[{_CJK}])")


@functools.cache
def _jieba() -> ModuleType:
    try:
        import jieba
    except ImportError:
        raise AttnkitError(
            "Chinese word segmentation needs jieba: pip install jieba (or attnkit[tokens])."
        ) from None
    jieba.setLogLevel(logging.WARNING)  # not its note about the dictionary it loads
    return jieba


def segment(text: str) -> list[str]:
    """jieba's words of `text` (its default, accurate mode with the HMM), spaces left out."""
    return [word for word in _jieba().lcut(text) if word.strip()]


def join_segmented(text: str) -> str:
    """`text` with one space between jieba's words where it had none."""
    out: list[str] = []
    for word in _jieba().lcut(text):
        if out and not word[0].isspace() and not out[-1][-1].isspace():
            out.append(" ")
        out.append(word)
    return "".join(out)


def unjoin(text: str) -> str:
    """`text` without the spaces between two CJK characters (those `join_segmented` adds)."""
    return _BETWEEN_CJK.sub("", text)
