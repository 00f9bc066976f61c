"""Stop words: the function words ("the", "of", "的") that word vectors learn little from.

The lists are spaCy's (`spacy.lang.<language>.stop_words.STOP_WORDS`: about 70
languages, in the `spacy` wheel, no model to download), or a file of the user's,
one word a line. Words are compared in lower case; a word leaves the sentence, so
the words around it become neighbours, as in the classic word2vec pipelines.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from attnkit.errors import AttnkitError
from attnkit.files import read_lines

SPACY = "spacy"  # the setting that names spaCy's list of `language`


def stop_words(source: str, language: str) -> frozenset[str]:
    """The stop words `source` names: "spacy" (spaCy's list of `language`) or a file."""
    if source == SPACY:
        try:
            module = importlib.import_module(f"spacy.lang.{language}.stop_words")
        except ModuleNotFoundError as err:
            if err.name and err.name.startswith("spacy.lang"):
                raise AttnkitError(
                    f"spaCy has no stop words for the language {language!r}; give its code "
                    "(en, de, fr, zh, ...) or a file of your own"
                ) from None
            raise AttnkitError(
                "spaCy's stop words need spacy: pip install spacy (or attnkit[tokens]); no model "
                "download is needed"
            ) from None
        return frozenset(w.lower() for w in module.STOP_WORDS)
    path = Path(source)
    if not path.is_file():
        raise AttnkitError(
            f"stop words {source!r} are neither 'spacy' nor a file of words, one a line"
        )
    return frozenset(w.strip().lower() for w in read_lines(path) if w.strip())
