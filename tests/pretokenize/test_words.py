"""jieba's words passed through unchanged, spaCy's stop words, Snowball's stems, simplemma's
lemmas, and the mistakes each is refused with."""

from __future__ import annotations

from pathlib import Path

import jieba
import pytest
import simplemma
import snowballstemmer
from spacy.lang.de.stop_words import STOP_WORDS as GERMAN
from spacy.lang.en.stop_words import STOP_WORDS as ENGLISH

from attnkit.errors import AttnkitError
from attnkit.pretokenize.segment import join_segmented, segment, unjoin
from attnkit.pretokenize.stems import stemmer
from attnkit.pretokenize.stopwords import stop_words

CHINESE = ["我爱北京天安门。", "南京市长江大桥欢迎你", "他来到了网易杭研大厦, 我们在 2024 年见面!"]


@pytest.mark.parametrize("text", CHINESE)
def test_jiebas_words_pass_through_unchanged(text) -> None:
    assert segment(text) == [w for w in jieba.lcut(text) if w.strip()]
    joined = join_segmented(text)
    assert joined.split() == segment(text)
    assert unjoin(joined).replace(" ", "") == text.replace(" ", "")


def test_unjoin_takes_out_only_spaces_between_cjk_characters() -> None:
    assert unjoin("北京 天安门 , Hello world 你好") == "北京天安门 , Hello world 你好"


def test_stop_words_are_spacys_lists_or_a_file(tmp_path: Path) -> None:
    assert stop_words("spacy", "en") == {w.lower() for w in ENGLISH}
    assert stop_words("spacy", "de") == {w.lower() for w in GERMAN} and "und" in GERMAN
    mine = tmp_path / "stop.txt"
    mine.write_text("The\n\nof\n", encoding="utf-8")
    assert stop_words(str(mine), "en") == {"the", "of"}
    with pytest.raises(AttnkitError, match="spaCy has no stop words for the language 'xx'"):
        stop_words("spacy", "xx")
    with pytest.raises(AttnkitError, match="neither 'spacy' nor a file of words"):
        stop_words(str(tmp_path / "missing.txt"), "en")


def test_stems_are_snowballs_and_lemmas_simplemmas() -> None:
    words = ["running", "runs", "generously", "studies", "mice", "better"]
    stem = stemmer("snowball", "en")
    assert [stem(w) for w in words] == snowballstemmer.stemmer("english").stemWords(words)
    assert stem("running") == stem("runs") == "run"
    lemma = stemmer("lemma", "de")
    assert lemma("Häuser") == simplemma.lemmatize("Häuser", lang="de") == "Haus"
    assert stemmer("lemma", "en")("mice") == "mouse"
    with pytest.raises(AttnkitError, match="Snowball has no stemmer for 'zz'"):
        stemmer("snowball", "zz")
    with pytest.raises(AttnkitError, match="simplemma has no lemmas for 'zz'"):
        stemmer("lemma", "zz")
