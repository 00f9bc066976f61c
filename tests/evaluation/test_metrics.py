"""BLEU and chrF through sacreBLEU with signatures, perplexity, exact match, WER and PER."""

import math

import pytest
import sacrebleu
import torch

from attnkit import AttnkitError
from attnkit.data.batch import Batch, pad
from attnkit.evaluation.metrics import (
    bleu,
    chrf,
    edit_distance,
    exact_match,
    length_ratio,
    perplexity,
    phoneme_error_rate,
    unknown_words_copied,
    word_error_rate,
)
from attnkit.tokenizer import Tokenizer
from tests.helpers import DECODING, tiny_model

HYPS = ["the cat sat on the mat", "a dog runs in the park", "hello world"]
REFS = ["the cat sat on a mat", "a dog is running in the park", "hello world"]


def test_bleu_and_chrf_equal_sacrebleu_and_carry_its_signature():
    score = bleu(HYPS, REFS)
    assert score.value == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert score.signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert "BLEU = " in str(score) and score.signature in str(score)
    assert chrf(HYPS, REFS).value == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)
    assert bleu(REFS, REFS).value == pytest.approx(100.0)


def test_lowercased_bleu_ignores_case_only():
    upper = [h.upper() for h in HYPS]
    lowered = bleu(upper, REFS, lowercase=True)
    assert lowered.value == pytest.approx(bleu(HYPS, REFS).value)
    assert lowered.value == pytest.approx(
        sacrebleu.corpus_bleu(upper, [REFS], lowercase=True).score
    )
    assert bleu(upper, REFS).value < lowered.value
    assert "case:lc" in lowered.signature and lowered.name == "BLEU (lowercased)"


def test_length_ratio_is_bleus_hypothesis_over_reference_length():
    result = sacrebleu.corpus_bleu(HYPS, [REFS])
    assert length_ratio(HYPS, REFS).value == pytest.approx(result.sys_len / result.ref_len)
    assert length_ratio(["the cat"], ["the cat sat on a mat"]).value == pytest.approx(2 / 6)
    assert length_ratio(REFS, REFS).value == 1.0


def test_exact_match_and_mismatched_inputs():
    assert exact_match(HYPS, REFS).value == pytest.approx(100 / 3)
    with pytest.raises(AttnkitError, match="3 hypotheses but 2 references"):
        bleu(HYPS, REFS[:2])


@pytest.mark.parametrize("shape", ["encoder-decoder", "decoder"])
def test_perplexity_is_exp_mean_nll_over_real_tokens(shape):
    model = tiny_model(shape, **DECODING).eval()
    tgt, tgt_mask = pad([[1, 7, 8, 9, 2], [1, 5, 2]], 0)
    src, src_mask = pad([[6, 7, 8], [9, 10]], 0)
    batch = (
        Batch(src, src_mask, tgt, tgt_mask)
        if shape == "encoder-decoder"
        else Batch(None, None, tgt, tgt_mask)
    )
    nll = []
    for row, length in ((0, 5), (1, 3)):
        ids = tgt[row : row + 1, :length]
        with torch.no_grad():
            if shape == "encoder-decoder":
                n = int(src_mask[row].sum())
                logits = model(src[row : row + 1, :n], ids[:, :-1]).logits
            else:
                logits = model(ids[:, :-1]).logits
        nll += (-logits.log_softmax(-1)[0].gather(1, ids[0, 1:, None])).flatten().tolist()
    score = perplexity(model, [batch])
    assert score.value == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-5)
    assert score.signature == "6 tokens"
    # Without a mask (an unpadded batch) every label counts: the first row alone.
    unpadded = Batch(src[:1, :3], None, tgt[:1], None)
    if shape == "decoder":
        unpadded = Batch(None, None, tgt[:1], None)
    score = perplexity(model, [unpadded])
    assert score.value == pytest.approx(math.exp(sum(nll[:4]) / 4), rel=1e-5)
    assert score.signature == "4 tokens"


# -- grapheme-to-phoneme: word and phoneme error rates --------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [
        ("", "", 0),
        ("", "K AE T", 3),
        ("K AE T", "", 3),
        ("K AE T", "K AE T", 0),
        ("K AE T", "K AA T S", 2),  # one substitution, one insertion
        ("k i t t e n", "s i t t i n g", 3),
        ("HH AH L OW", "L OW HH AH", 4),
    ],
)
def test_edit_distance_is_levenshtein_over_tokens(a, b, distance):
    assert edit_distance(a.split(), b.split()) == distance
    assert edit_distance(b.split(), a.split()) == distance


G2P_HYPS = ["HH AH L OW", "T AH M EY T OW", "", "K AE T"]
G2P_REFS = [
    ["HH AH L OW", "HH EH L OW"],  # the first of two right
    ["T AH M AA T OW", "T AH M EY T OW"],  # the second of two right
    "D AO G",  # one reference as a plain string; nothing produced: 3 deletions
    ["K AA T S", "K AE"],  # the closer one is the second: 1 edit over its 2 tokens
]


def test_wer_counts_words_matching_none_of_their_references():
    score = word_error_rate(G2P_HYPS, G2P_REFS)
    assert (score.name, score.value) == ("WER", 50.0)
    assert score.signature == "nrefs:1-2|match:any ref|tok:space"
    # Spacing is not a difference; one wrong phoneme is a wrong word.
    assert word_error_rate([" HH  AH L OW "], ["HH AH L OW"]).value == 0.0
    assert word_error_rate(["HH AH L AO"], [["HH AH L OW"]]).value == 100.0


def test_per_sums_edits_to_the_closest_reference_over_those_references_lengths():
    score = phoneme_error_rate(G2P_HYPS, G2P_REFS)
    # Edits 0 + 0 + 3 + 1 over closest lengths 4 + 6 + 3 + 2.
    assert (score.name, score.value) == ("PER", pytest.approx(100 * 4 / 15))
    assert score.signature == "nrefs:1-2|ref:closest|tok:space"
    # Of two equally close references the first listed is the one measured against.
    assert phoneme_error_rate(["A B"], [["A", "A B C"]]).value == pytest.approx(100.0)
    assert phoneme_error_rate(["A B"], [["A B C", "A"]]).value == pytest.approx(100 / 3)
    # The closest is the one of fewest edits, though another would give a lower rate:
    # 1 edit of 1 phoneme is measured, not 2 edits of 4.
    assert phoneme_error_rate(["A B"], [["A B C D", "A"]]).value == pytest.approx(100.0)
    # Nothing produced at all: every reference phoneme is an error.
    assert phoneme_error_rate(["", ""], [["A B"], ["C"]]).value == 100.0


def test_error_rates_refuse_mismatched_or_missing_references():
    with pytest.raises(AttnkitError, match="2 hypotheses but 1 references"):
        word_error_rate(["A", "B"], [["A"]])
    with pytest.raises(AttnkitError, match="source 2 has no reference"):
        phoneme_error_rate(["A", "B"], [["A"], []])
    with pytest.raises(AttnkitError, match="the closest references are all empty"):
        phoneme_error_rate(["A"], [[""]])


def test_unknown_words_copied_counts_only_reference_words_the_source_has() -> None:
    tokenizer = Tokenizer.train("word", texts=["a dog runs .", "the cat sleeps ."], vocab_size=30)
    sources = ["Rex und Fido laufen .", "die Katze Tom", "ein Hund"]
    references = ["Rex and Fido run .", "the cat Tom Tom sleeps", "a dog Bello"]
    hypotheses = ["Rex runs Rex .", "the cat Tom", "a dog"]
    score = unknown_words_copied(sources, references, hypotheses, tokenizer)
    # Wanted: Rex, Fido | Tom, Tom (Bello is in no source, "and"/"run" neither): 4 words;
    # produced: Rex (once, clipped) | Tom (once).
    assert score is not None and score.value == pytest.approx(50.0)
    assert unknown_words_copied(["a dog"], ["a dog"], ["a dog"], tokenizer) is None
