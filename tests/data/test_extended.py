"""The extended vocabulary: unknown source words numbered per sentence, copies written back."""

from __future__ import annotations

import pytest
import torch
from tokenizers import AddedToken, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from attnkit import EncoderDecoder
from attnkit.data import extended
from attnkit.data.datasets import ParallelDataset
from attnkit.errors import AttnkitError
from attnkit.generation import GenerationConfig
from attnkit.inference import translate
from attnkit.tokenizer import SPECIAL_TOKENS, Tokenizer
from tests.helpers import tiny_config

WORDS = ["a", "dog", "runs", "cat", "the", "."]


def word_tokenizer() -> Tokenizer:
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *WORDS])}
    backend = Backend(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL_TOKENS])
    return Tokenizer(backend)


TOK = word_tokenizer()
V = TOK.vocab_size
ID = {w: TOK.token_to_id(w) for w in WORDS}


def test_unknown_source_words_get_ids_past_the_vocabulary_per_sentence() -> None:
    ids, unknown = extended.encode_sources(TOK, ["the dog Rex runs Rex Fido .", "a cat Tom"])
    assert unknown == [["Rex", "Fido"], ["Tom"]]
    assert ids[0] == [ID["the"], ID["dog"], V, ID["runs"], V, V + 1, ID["."], TOK.eos_id]
    assert ids[1] == [ID["a"], ID["cat"], V, TOK.eos_id]  # numbered again in each sentence


def test_targets_reuse_the_source_ids_and_keep_unk_for_words_only_they_have() -> None:
    src, tgt = extended.encode_pairs(TOK, ["the dog Rex runs"], ["Rex the dog Max runs"])
    assert src[0][2] == V
    assert tgt[0] == [TOK.bos_id, V, ID["the"], ID["dog"], TOK.unk_id, ID["runs"], TOK.eos_id]


def test_decoding_writes_copied_words_as_their_source_has_them() -> None:
    rows = [[ID["the"], V + 1, ID["runs"], V, TOK.eos_id], [V + 5, ID["a"]]]
    texts = extended.decode(TOK, rows, [["Rex", "Fido"], ["Tom"]])
    assert texts == ["the Fido runs Rex", "a"]  # an id its source has no word for is dropped


def test_a_copy_dataset_holds_extended_ids() -> None:
    data = ParallelDataset([("the dog Rex runs", "Rex runs")], TOK, copy=True)
    src, tgt = data[0]
    assert src.tolist()[2] == V and tgt.tolist()[1] == V


def test_translate_produces_and_detokenizes_a_copied_unknown_word() -> None:
    # A model that always copies (p_gen = 0) with a uniform attention (no query weights):
    # the unknown word fills three of the source's four positions, </s> the fourth.
    torch.manual_seed(0)
    config = tiny_config(vocab_size=V, copy_attention="mean", unk_id=TOK.unk_id, eos_id=TOK.eos_id)
    model = EncoderDecoder(config.replace(decoder_start_id=TOK.bos_id)).eval()
    with torch.no_grad():
        model.copy.gate.weight.zero_()
        model.copy.gate.bias.fill_(-100.0)
        model.decoder.blocks[-1].cross_attn.q_proj.weight.zero_()
        model.decoder.blocks[-1].cross_attn.q_proj.bias.zero_()
    out = translate(model, TOK, ["Zyzzyva Zyzzyva Zyzzyva"], GenerationConfig(max_new_tokens=2))
    assert out == ["Zyzzyva Zyzzyva"]


def test_a_copied_character_is_written_inside_its_word() -> None:
    chars = Tokenizer.train("char", texts=["the cat sat"], vocab_size=40)
    ids, unknown = extended.encode_sources(chars, ["the caté sat"])
    assert unknown == [["é"]]
    row = ids[0][:-1]  # without </s>
    assert extended.decode(chars, [row], unknown) == ["the caté sat"]


def test_long_sources_are_cut_with_a_warning(caplog) -> None:
    ids, _ = extended.encode_sources(TOK, ["a dog runs Rex Rex ."], max_length=4)
    assert ids == [[ID["a"], ID["dog"], ID["runs"], TOK.eos_id]]
    assert "truncated 1 of 1 sources" in caplog.text


def test_a_copy_dataset_without_usable_pairs_says_so() -> None:
    with pytest.raises(AttnkitError, match="no usable sentences"):
        ParallelDataset([("", "Rex")], TOK, copy=True)
