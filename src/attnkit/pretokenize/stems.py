"""Stems and lemmas: the inflected forms of a word ("runs", "running") made one word ("run").

A stem is what a suffix-stripping algorithm leaves ("generously" -> "generous",
"studies" -> "studi"): Snowball's stemmers (the `snowballstemmer` package, Porter's
algorithm and its successors for about 30 languages). A lemma is the dictionary
form ("mice" -> "mouse", "Häuser" -> "Haus"): simplemma's lookup tables (about 50
languages, in its wheel). Both work offline on single words, without a model.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from attnkit.errors import AttnkitError

STEMMERS = ("none", "snowball", "lemma")
# Snowball's algorithms by the ISO 639-1 codes the other options use.
SNOWBALL = {
    "ar": "arabic", "hy": "armenian", "eu": "basque", "ca": "catalan", "cs": "czech",
    "da": "danish", "nl": "dutch", "en": "english", "eo": "esperanto", "et": "estonian",
    "fi": "finnish", "fr": "french", "de": "german", "el": "greek", "hi": "hindi",
    "hu": "hungarian", "id": "indonesian", "ga": "irish", "it": "italian", "lt": "lithuanian",
    "ne": "nepali", "nb": "norwegian", "no": "norwegian", "fa": "persian", "pl": "polish",
    "pt": "portuguese", "ro": "romanian", "ru": "russian", "sr": "serbian", "es": "spanish",
    "sv": "swedish", "ta": "tamil", "tr": "turkish", "yi": "yiddish",
}  # fmt: skip


def stemmer(kind: str, language: str) -> Callable[[str], str]:
    """A word's stem (`snowball`) or lemma (`lemma`) in `language` (an ISO 639-1 code)."""
    if kind == "snowball":
        return _snowball(language)
    if kind == "lemma":
        return _lemma(language)
    raise AttnkitError(f"unknown stemmer {kind!r}; choose one of {', '.join(STEMMERS)}")


def _snowball(language: str) -> Callable[[str], str]:
    if language not in SNOWBALL:
        raise AttnkitError(
            f"Snowball has no stemmer for {language!r}; choose one of {', '.join(SNOWBALL)}"
        )
    try:
        import snowballstemmer
    except ImportError:
        raise AttnkitError(
            "stems need snowballstemmer: pip install snowballstemmer (or attnkit[tokens])"
        ) from None
    algorithm = snowballstemmer.stemmer(SNOWBALL[language])
    return functools.lru_cache(maxsize=1 << 16)(algorithm.stemWord)


def _lemma(language: str) -> Callable[[str], str]:
    try:
        import simplemma
        from simplemma.strategies.dictionaries.dictionary_factory import SUPPORTED_LANGUAGES
    except ImportError:
        raise AttnkitError(
            "lemmas need simplemma: pip install simplemma (or attnkit[tokens])"
        ) from None
    if language not in SUPPORTED_LANGUAGES:
        raise AttnkitError(f"simplemma has no lemmas for {language!r}; give an ISO 639-1 code")

    def lemma(word: str) -> str:
        return simplemma.lemmatize(word, lang=language)

    return functools.lru_cache(maxsize=1 << 16)(lemma)
