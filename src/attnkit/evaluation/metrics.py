"""Evaluation: how good the outputs are.

    BLEU = BP * exp(sum_n 1/4 log p_n),  BP = min(1, exp(1 - r / c))     (sacreBLEU)
    chrF = F_beta over character n-gram precision and recall, beta = 2   (sacreBLEU)
    length ratio = c / r, hypothesis over reference tokens (BLEU's, 13a)
    perplexity = exp(-1/N sum_t log p(y_t | y_<t, x))  over the N real target tokens
    exact match = share of hypotheses equal to their reference
    unknown words copied = 100 * sum_i |U_i ∩ H_i| / sum_i |U_i|, U_i the words of reference
        i that the vocabulary lacks and its source has, H_i the hypothesis's words
        (multisets): what only copying can produce (a pointer-generator, `nn/copy.py`)

and, for grapheme-to-phoneme conversion, over space-separated tokens (phonemes)
with one or more references per source, any of which is right:

    WER = 100 * (sources whose hypothesis is none of its references) / (sources)
    PER = 100 * sum_i d(h_i, r_i*) / sum_i |r_i*|,   r_i* = argmin_r d(h_i, r)

where d is the Levenshtein distance over tokens (substitutions, insertions and
deletions cost 1) and r_i* the closest reference (the first listed of equally
close ones). The WER of G2P counts whole words wrong, as Yao & Zweig (2015) and
Yolchuyeva et al. (2019) do: it is not speech recognition's word-level edit
distance, which PER is over phonemes.

BLEU and chrF come from sacreBLEU on detokenized text, and every score
carries sacreBLEU's signature, so numbers are comparable across papers.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnkit.data import extended
from attnkit.data.batch import Batch, shift_targets
from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel
from attnkit.tokenizer import Tokenizer


@dataclass(frozen=True)
class Score:
    """One corpus-level metric: its name, its value, how it was computed, decimals shown."""

    name: str
    value: float
    signature: str = ""
    digits: int = 2

    def __str__(self) -> str:
        text = f"{self.name} = {self.value:.{self.digits}f}"
        return f"{text}  ({self.signature})" if self.signature else text


def _check_pairs(hypotheses: Sequence[str], references: Sequence[object]) -> None:
    if len(hypotheses) != len(references):
        raise AttnkitError(
            f"there are {len(hypotheses)} hypotheses but {len(references)} references; "
            "give one hypothesis per reference line"
        )
    if not hypotheses:
        raise AttnkitError("there is nothing to score: the hypotheses are empty")


def bleu(
    hypotheses: Sequence[str],
    references: Sequence[str],
    tokenize: str = "13a",
    lowercase: bool = False,
) -> Score:
    """Corpus BLEU of detokenized hypotheses against one reference each, via sacreBLEU.

    The standard score is cased; `lowercase` gives the case-insensitive one that
    small-model tutorials on Multi30k report (their text is lowercased).
    """
    from sacrebleu.metrics import BLEU

    _check_pairs(hypotheses, references)
    metric = BLEU(tokenize=tokenize, lowercase=lowercase)
    result = metric.corpus_score(list(hypotheses), [list(references)])
    name = "BLEU (lowercased)" if lowercase else "BLEU"
    return Score(name, result.score, str(metric.get_signature()))


def chrf(hypotheses: Sequence[str], references: Sequence[str]) -> Score:
    """Corpus chrF (character 6-grams, beta 2) against one reference each, via sacreBLEU."""
    from sacrebleu.metrics import CHRF

    _check_pairs(hypotheses, references)
    metric = CHRF()
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return Score("chrF", result.score, str(metric.get_signature()))


def length_ratio(hypotheses: Sequence[str], references: Sequence[str]) -> Score:
    """Hypothesis tokens over reference tokens, in sacreBLEU's 13a tokens: BLEU's brevity
    penalty reads it, and a model trained on a reward that shortens its output shows it here."""
    from sacrebleu.metrics import BLEU

    _check_pairs(hypotheses, references)
    result = BLEU().corpus_score(list(hypotheses), [list(references)])
    return Score("length ratio", result.sys_len / max(result.ref_len, 1), "tok:13a", digits=3)


def exact_match(hypotheses: Sequence[str], references: Sequence[str]) -> Score:
    """Percentage of hypotheses identical to their reference (surrounding spaces ignored)."""
    _check_pairs(hypotheses, references)
    same = sum(h.strip() == r.strip() for h, r in zip(hypotheses, references, strict=True))
    return Score("exact match", 100.0 * same / len(hypotheses))


References = Sequence[str | Sequence[str]]
"""One item per hypothesis: its reference, or a sequence of references of which any is right."""


def _reference_sets(hypotheses: Sequence[str], references: References) -> list[list[list[str]]]:
    """Each hypothesis's references as token lists; a source without any is refused."""
    _check_pairs(hypotheses, references)
    sets = [[r.split() for r in ([refs] if isinstance(refs, str) else refs)] for refs in references]
    if not all(sets):
        empty = next(i for i, refs in enumerate(sets, start=1) if not refs)
        raise AttnkitError(f"source {empty} has no reference; give each at least one")
    return sets


def _nrefs(sets: list[list[list[str]]]) -> str:
    """How many references the sources have, as sacreBLEU's signatures say it: nrefs:1-3."""
    low, high = min(map(len, sets)), max(map(len, sets))
    return f"nrefs:{low}" if low == high else f"nrefs:{low}-{high}"


def edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Levenshtein distance between two token sequences (each edit costs 1)."""
    if len(a) < len(b):
        a, b = b, a
    # One row of the dynamic programme at a time, over the shorter sequence.
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        diagonal, row[0] = row[0], i
        for j, y in enumerate(b, start=1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (x != y))
    return row[-1]


def word_error_rate(hypotheses: Sequence[str], references: References) -> Score:
    """Percentage of sources whose hypothesis, as tokens, equals none of its references."""
    sets = _reference_sets(hypotheses, references)
    wrong = sum(h.split() not in refs for h, refs in zip(hypotheses, sets, strict=True))
    return Score("WER", 100.0 * wrong / len(sets), f"{_nrefs(sets)}|match:any ref|tok:space")


def phoneme_error_rate(hypotheses: Sequence[str], references: References) -> Score:
    """Summed token edit distance to each source's closest reference, over the summed
    lengths of those references, as a percentage."""
    sets = _reference_sets(hypotheses, references)
    errors = length = 0
    for hypothesis, refs in zip(hypotheses, sets, strict=True):
        tokens = hypothesis.split()
        distance, closest = min((edit_distance(tokens, r), i) for i, r in enumerate(refs))
        errors += distance
        length += len(refs[closest])
    if length == 0:
        raise AttnkitError("the closest references are all empty; PER has no length to divide by")
    signature = f"{_nrefs(sets)}|ref:closest|tok:space"
    return Score("PER", 100.0 * errors / length, signature)


def unknown_words_copied(
    sources: Sequence[str],
    references: Sequence[str],
    hypotheses: Sequence[str],
    tokenizer: Tokenizer,
) -> Score | None:
    """The share of the reference words outside the vocabulary but in their source that the
    hypotheses have too (counts clipped, as BLEU clips n-grams); None when there are none."""
    _check_pairs(hypotheses, references)
    if not tokenizer.has("unk"):
        return None  # byte-level vocabularies know every word
    wanted = produced = 0
    # Copied words are outside the vocabulary too, so they are among the hypothesis's.
    sides = (sources, references, hypotheses)
    for src, ref, hyp in zip(*(extended.unknown_words(tokenizer, t) for t in sides), strict=True):
        in_source = Counter(w for w in ref if w in src)
        have = Counter(hyp)
        wanted += sum(in_source.values())
        produced += sum(min(n, have[w]) for w, n in in_source.items())
    if not wanted:
        return None
    what = f"{wanted} reference words outside the vocabulary, in the source"
    return Score("unknown words copied", 100.0 * produced / wanted, what, digits=1)


@torch.no_grad()
def perplexity(model: TransformerModel, batches: Iterable[Batch]) -> Score:
    """exp of the mean negative log-likelihood per real target token, padding excluded.

    Each batch's `tgt` starts with <s> and is predicted from position 1 on; an
    encoder-decoder also reads `src`. The model runs in eval mode.
    """
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for batch in batches:
            batch = batch.to(model.device)
            tgt, tgt_mask = batch.tgt, batch.tgt_mask
            if tgt is None:
                raise AttnkitError("perplexity needs batches with a target (tgt)")
            if tgt.shape[0] == 0 or tgt.shape[1] < 2:
                continue  # nothing to predict: no rows, or <s> alone
            inputs, mask, labels = shift_targets(tgt, tgt_mask, ignore=-100)
            if model.config.shape == "encoder-decoder":
                logits = model(batch.src, inputs, batch.src_mask, mask).logits
            else:
                logits = model(inputs, mask).logits
            nll = F.cross_entropy(
                logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum"
            )
            total += nll.item()
            count += int((labels != -100).sum())
    finally:
        model.train(was_training)
    if count == 0:
        raise AttnkitError("perplexity needs at least one target token after <s>")
    return Score("perplexity", math.exp(total / count), f"{count} tokens")
