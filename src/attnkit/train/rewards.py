"""Sentence-level rewards for sequence-level training: BLEU and chrF of one output each.

    sentence BLEU = BP * exp(sum_n 1/4 log p_n) with effective order and exp smoothing
    sentence chrF = F_2 over character 1..6-gram precision and recall

Both are sacreBLEU's own sentence scores (`sacrebleu.sentence_bleu`, `sentence_chrf`)
on detokenized text, divided by 100 so a reward lies in [0, 1]: a model trained on
them optimises the number `attnkit eval` reports, sentence by sentence. One metric
object is built per reward and reused, which is what makes scoring cheap (building
sacreBLEU's tokenizer per call costs more than the scoring).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

REWARDS = ("bleu", "chrf")


class SentenceReward:
    """`reward(hypotheses, references) -> (n,)` tensor of sentence scores in [0, 1]."""

    def __init__(self, name: str = "bleu", lowercase: bool = False) -> None:
        from sacrebleu.metrics import BLEU, CHRF

        if name == "bleu":
            # The settings of sacrebleu.sentence_bleu: exp smoothing, effective order.
            self.metric = BLEU(lowercase=lowercase, effective_order=True)
        else:
            self.metric = CHRF(lowercase=lowercase)

    def __call__(self, hypotheses: Sequence[str], references: Sequence[str]) -> Tensor:
        scores = [
            self.metric.sentence_score(h, [r]).score
            for h, r in zip(hypotheses, references, strict=True)
        ]
        return torch.tensor(scores, dtype=torch.float64) / 100.0
