"""The pre-tokenization steps in a tokenizer and in the word-vector tasks: phrases joined in the
text and undone when decoding, saved with the tokenizer, a user's rule, and the options refused
where they make no sense."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jieba
import pytest

from attnkit.embeddings.vectors import load_vectors
from attnkit.errors import AttnkitError
from attnkit.pretokenize import PretokenizeConfig, Pretokenizer
from attnkit.run import RunFolder
from attnkit.tokenizer import Tokenizer
from attnkit.train.run_config import RunConfig
from attnkit.train.tasks import build_task, train

FILLERS = [
    "she",
    "he",
    "it",
    "studies",
    "loves",
    "sees",
    "visits",
    "paints",
    "leaves",
    "finds",
    "the",
    "a",
    "and",
    "is",
    "of",
    "red",
    "old",
    "big",
]


def _lines(n: int = 150) -> list[str]:
    """Sentences of random fillers around "New York", which only the phrase ties together."""
    g = random.Random(0)
    return [
        f"{g.choice(FILLERS)} {g.choice(FILLERS)} New York {g.choice(FILLERS)}." for _ in range(n)
    ]


LINES = _lines()
PHRASES = {"phrases": 1, "phrase_min_count": 1, "phrase_threshold": 1.0}


def _pretokenizer(**settings) -> Pretokenizer:
    return Pretokenizer(PretokenizeConfig(**settings))


@pytest.mark.parametrize("kind", ["word", "bpe", "unigram"])
def test_a_tokenizer_makes_a_phrase_one_token_and_decodes_it_back(kind, tmp_path) -> None:
    tokenizer = Tokenizer.train(
        kind, texts=LINES, vocab_size=120, pretokenizer=_pretokenizer(**PHRASES)
    )
    assert "New_York" in tokenizer.pretokenizer.phrases.passes[0].scores
    ids = tokenizer.encode("New York is big")
    pieces = [tokenizer.id_to_token(i) for i in ids]
    assert "".join(pieces).replace("▁", "").startswith("New_York")  # the model reads the phrase
    if kind != "unigram":  # whose likelihood keeps few long pieces from a text this small
        assert pieces[0].lstrip("▁") == "New_York"
    assert tokenizer.decode(ids) == "New York is big"
    # saved beside the tokenizer and read back with it; the fingerprint knows the phrases
    loaded = Tokenizer.load(tokenizer.save(tmp_path))
    assert (tmp_path / "tokenizer.pretokenize.json").is_file()
    assert loaded.encode("she loves New York") == tokenizer.encode("she loves New York")
    assert loaded.fingerprint == tokenizer.fingerprint
    plain = Tokenizer(tokenizer.backend)
    assert plain.fingerprint != tokenizer.fingerprint


def test_phrases_rewrite_only_the_spaces_inside_them() -> None:
    p = _pretokenizer(**PHRASES)
    p.learn_from_text(LINES)
    assert p.text("(New York), New  York. New. York") == "(New_York), New_York. New. York"
    assert p.restore("(New_York), New_York. New. York") == "(New York), New York. New. York"
    assert p.restore("a snake_case word") == "a snake_case word"  # not a phrase: kept


def test_jieba_spaces_the_words_for_a_tokenizer_and_decoding_takes_them_out() -> None:
    text = ["我爱北京天安门", "北京是中国的首都"] * 20
    tokenizer = Tokenizer.train(
        "word", texts=text, vocab_size=60, pretokenizer=_pretokenizer(segment="jieba")
    )
    ids = tokenizer.encode("我爱北京")
    assert [tokenizer.id_to_token(i) for i in ids] == ["我", "爱", "北京"]
    assert tokenizer.decode(ids) == "我爱北京"


def test_a_users_rule_runs_first(tmp_path: Path) -> None:
    p = _pretokenizer(rule="tests.helpers:hashtags_apart")
    assert p.text("#NewYork rocks") == "# NewYork rocks"
    assert p.split("#NewYork rocks", str.split) == ["#", "NewYork", "rocks"]
    with pytest.raises(AttnkitError, match=r"cannot be loaded .* put the module on PYTHONPATH"):
        _pretokenizer(rule="no_such_module:rule")
    with pytest.raises(AttnkitError, match="or name a function as module:function"):
        PretokenizeConfig(rule="just_a_name")


@pytest.mark.parametrize("kind", ["byte-bpe", "wordpiece", "char"])
def test_phrases_are_refused_where_the_tokenizer_splits_them_again(kind) -> None:
    with pytest.raises(AttnkitError, match=f"a {kind} tokenizer splits phrases again"):
        Tokenizer.train(kind, texts=LINES, vocab_size=400, pretokenizer=_pretokenizer(**PHRASES))


def test_stop_words_and_stems_are_refused_for_a_tokenizer() -> None:
    with pytest.raises(AttnkitError, match=r"pretokenize\.stop_words and pretokenize\.stem drop"):
        Tokenizer.train(
            "bpe", texts=LINES, pretokenizer=_pretokenizer(stop_words="spacy", stem="snowball")
        )


def _config(tmp_path: Path, corpus: Path, task: str, **pretokenize) -> RunConfig:
    sections = {
        "data": {"task": task, "corpus": str(corpus), "lowercase": True, "tokenizer": "word",
                 "vocab_size": 60, "block_size": 4, "batch_size": 4},
        "model": {"preset": "gpt-tiny", "d_model": 8, "n_heads": 2, "d_ff": 16,
                  "n_decoder_layers": 1},
        "word2vec": {"dim": 8, "min_count": 1, "epochs": 1},
        "train": {"out_dir": str(tmp_path / "run"), "threads": 1, "steps": 1},
        "pretokenize": pretokenize,
    }  # fmt: skip
    return RunConfig.from_dict(sections)


def test_word_vectors_take_phrases_stop_words_and_stems(tmp_path: Path) -> None:
    corpus = tmp_path / "text.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    settings = {**PHRASES, "stop_words": "spacy", "stem": "snowball"}
    train(_config(tmp_path, corpus, "word2vec", **settings))
    folder = RunFolder(tmp_path / "run")
    words = set(load_vectors(folder.vectors).words)
    assert "new_york" in words and "new" not in words  # joined (in lower case)
    assert not words & {"she", "he", "it", "the", "a", "and", "is", "of"}  # spaCy's stop words
    assert {"love", "studi", "visit"} <= words and "loves" not in words  # Snowball's stems
    saved = json.loads(folder.pretokenize.read_text(encoding="utf-8"))
    assert saved["config"]["stem"] == "snowball" and saved["phrases"]["passes"]


def test_a_language_models_tokenizer_keeps_its_phrases_in_the_run_folder(tmp_path: Path) -> None:
    corpus = tmp_path / "text.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    setup = build_task(_config(tmp_path, corpus, "language-model", **PHRASES))
    assert setup.tokenizer.token_to_id("New_York") is not None
    train(_config(tmp_path, corpus, "language-model", **PHRASES))
    loaded = RunFolder(tmp_path / "run").load_tokenizer()  # the fingerprint check passes
    assert loaded.decode(loaded.encode("she loves New York")) == "she loves New York"


@pytest.mark.parametrize(
    ("task", "settings", "message"),
    [
        ("language-model", {"stop_words": "spacy"}, "pretokenize.stop_words drop or change words"),
        ("translation", {"stem": "lemma"}, "only word vectors may do"),
        ("reverse", {"segment": "jieba"}, "the reverse demo has a fixed vocabulary"),
    ],
)
def test_options_are_refused_where_they_make_no_sense(tmp_path, task, settings, message) -> None:
    corpus = tmp_path / "text.txt"
    corpus.write_text("a b\n", encoding="utf-8")
    with pytest.raises(AttnkitError, match=message):
        build_task(_config(tmp_path, corpus, task, **settings))
    bpe = RunConfig.from_dict({**_config(tmp_path, corpus, "language-model", **PHRASES).to_dict()})
    wordpiece = RunConfig.from_dict(
        {**bpe.to_dict(), "data": {**bpe.to_dict()["data"], "tokenizer": "wordpiece"}}
    )
    with pytest.raises(AttnkitError, match=r"set data\.tokenizer to one of bpe, unigram, word"):
        build_task(wordpiece)


def test_word_vectors_of_chinese_text_take_jiebas_words_without_its_punctuation() -> None:
    from attnkit.train.vector_text import split_words

    p = _pretokenizer(segment="jieba")
    text = "我爱北京天安门。 他来了!"
    expected = [w for w in jieba.lcut(text) if w.strip() and w not in "。!"]
    assert p.split(text, split_words) == expected and expected[:4] == ["我", "爱", "北京", "天安门"]
