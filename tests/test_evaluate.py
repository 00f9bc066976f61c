"""BLEU and chrF through sacreBLEU with signatures, perplexity, exact match."""

import math

import pytest
import sacrebleu
import torch

from attnkit import AttnkitError
from attnkit.data.batch import Batch, pad
from attnkit.evaluate import bleu, chrf, exact_match, length_ratio, perplexity
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
