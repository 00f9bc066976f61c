"""Phrase detection against gensim's Phrases on the same corpus and settings."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from gensim.models.phrases import ENGLISH_CONNECTOR_WORDS
from gensim.models.phrases import Phrases as GensimPhrases

from attnkit.errors import AttnkitError
from attnkit.pretokenize.phrases import Phrases, learn_phrases
from attnkit.train.vector_text import split_words


@pytest.fixture(scope="module")
def sentences(data_dir: Path) -> list[list[str]]:
    with gzip.open(data_dir / "multi30k" / "train.en.gz", "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()[:8000]
    return [split_words(line.lower()) for line in lines]


@pytest.mark.parametrize("connectors", [frozenset(), ENGLISH_CONNECTOR_WORDS])
@pytest.mark.parametrize(("min_count", "threshold"), [(5, 10.0), (2, 30.0)])
def test_one_pass_finds_gensims_phrases_with_gensims_scores(
    sentences, connectors, min_count, threshold
) -> None:
    ours = learn_phrases(sentences, min_count, threshold, connectors=connectors)
    theirs = GensimPhrases(
        sentences, min_count=min_count, threshold=threshold, connector_words=connectors
    )
    found = {p: s for sentence in sentences for p, s in theirs.analyze_sentence(sentence) if s}
    assert len(found) > 100
    for phrase, score in found.items():  # every phrase gensim applies, at its score
        assert ours.scores[phrase] == pytest.approx(score, rel=1e-12)
    for phrase in ours.scores:  # and ours are phrases to gensim: the same score above threshold
        first, *between, last = phrase.split("_")
        assert theirs.score_candidate(first, last, between)[1] == pytest.approx(ours.scores[phrase])
    assert all(ours.join(s) == theirs[s] for s in sentences)


def test_two_passes_join_what_gensim_joins_on_its_own_output(sentences) -> None:
    ours = Phrases.learn(sentences, passes=2, connectors=ENGLISH_CONNECTOR_WORDS)
    first = GensimPhrases(sentences, connector_words=ENGLISH_CONNECTOR_WORDS)
    second = GensimPhrases(first[sentences], connector_words=ENGLISH_CONNECTOR_WORDS)
    joined = [ours.join(s) for s in sentences]
    assert joined == [second[first[s]] for s in sentences]
    longest = max((t for s in joined for t in s), key=lambda t: t.count("_"))
    assert longest.count("_") >= 2  # the second pass made phrases of phrases
    assert Phrases.from_dict(ours.to_dict()).join(sentences[0]) == joined[0]


def test_a_delimiter_must_be_text_without_spaces() -> None:
    with pytest.raises(AttnkitError, match="text without spaces, not ' '"):
        learn_phrases([["a", "b"]], delimiter=" ")
