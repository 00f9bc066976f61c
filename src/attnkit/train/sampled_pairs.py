"""Preference pairs without people: of the translations a model samples for a source, the one
with the best sentence BLEU against the reference is "chosen" and the one with the worst is
"rejected" (the metric stands in for the person who would rank them).

    for each source x with reference t:   y_1 .. y_K ~ pi(. | x)  (K = pairs.candidates)
        chosen   = argmax_k BLEU(y_k, t)      rejected = argmin_k BLEU(y_k, t)
        kept if BLEU(chosen) - BLEU(rejected) > pairs.min_gap

`data.task = "sampled-pairs"` (`attnkit.train.pairs_task`) writes them from a translation run
(`train.init_from`) over the splits `data.train_split` and `data.valid_split` of a translation
corpus (`data.corpus`, `src_lang`, `tgt_lang`), at most `pairs.max_sources` sources of each,
into the folder `train.out_dir` as `{split}.jsonl` with TRL's fields `prompt` (the source),
`chosen` and `rejected` (`attnkit.data.preference` reads them back): the input of the
`preference` (DPO), `reward-model` and `ppo` tasks. metrics.jsonl records, per split, the
sources read, the pairs kept and the mean reward of each side.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnkit.checks import check, choice, finite_fields, non_negative, positive
from attnkit.data.batch import pad
from attnkit.data.preference import PreferencePair
from attnkit.files import atomic_write
from attnkit.generation import GenerationConfig, generate
from attnkit.generation.state import evaluating
from attnkit.models import TransformerModel
from attnkit.tokenizer import Tokenizer
from attnkit.train.rewards import REWARDS, SentenceReward


@dataclass(frozen=True)
class PairsSection:
    """Preference pairs from sampled translations (`data.task = "sampled-pairs"`).

    candidates: K, the translations sampled per source; the best and the worst make a pair.
    temperature: of the softmax they are sampled from.
    reward: what ranks them: `bleu` or `chrf`, sacreBLEU's sentence scores against the reference.
    min_gap: the least difference of reward (in [0, 1]) between chosen and rejected; a source
        whose candidates differ less gives no pair.
    max_sources: the sources read of each split (its first ones); 0 reads them all.
    max_new_tokens: the longest translation sampled.
    """

    candidates: int = 4
    temperature: float = 1.0
    reward: str = "bleu"
    min_gap: float = 0.0
    max_sources: int = 0
    max_new_tokens: int = 64

    def __post_init__(self) -> None:
        finite_fields(self, "pairs")
        positive("pairs.temperature", self.temperature)
        positive("pairs.max_new_tokens", self.max_new_tokens)
        non_negative("pairs.min_gap", self.min_gap)
        non_negative("pairs.max_sources", self.max_sources)
        choice("pairs.reward", self.reward, REWARDS)
        check(
            self.candidates >= 2,
            f"pairs.candidates must be at least 2 (a best and a worst), got {self.candidates}",
        )


def rank_candidates(
    candidates: Sequence[str], rewards: Sequence[float], min_gap: float
) -> tuple[str, str, float, float] | None:
    """(chosen, rejected, their rewards) of one source's candidates, or None when the best and
    the worst are the same text or differ by no more than `min_gap`."""
    best = max(range(len(candidates)), key=lambda k: rewards[k])
    worst = min(range(len(candidates)), key=lambda k: rewards[k])
    if candidates[best] == candidates[worst] or rewards[best] - rewards[worst] <= min_gap:
        return None
    return candidates[best], candidates[worst], rewards[best], rewards[worst]


def sample_pairs(
    model: TransformerModel,
    tokenizer: Tokenizer,
    sources: Sequence[str],
    references: Sequence[str],
    section: PairsSection,
    batch_size: int = 32,
) -> tuple[list[PreferencePair], dict[str, float]]:
    """The pairs of `sources` (an encoder-decoder's) and what they came to: sources, pairs and
    the mean reward of the chosen and of the rejected translations."""
    s = section
    reward = SentenceReward(s.reward)
    options = GenerationConfig(
        do_sample=True, temperature=s.temperature, num_return_sequences=s.candidates
    )
    max_new = min(s.max_new_tokens, model.config.max_len - 1)
    pairs, chosen, rejected = [], [], []
    for start in range(0, len(sources), batch_size):
        texts = sources[start : start + batch_size]
        ids = [row[: model.config.max_len] for row in tokenizer.encode_batch(texts, add_eos=True)]
        inputs, mask = pad(ids, tokenizer.pad_id)
        with evaluating(model), torch.no_grad():
            out = generate(
                model,
                inputs.to(model.device),
                mask.to(model.device),
                options,
                max_new_tokens=max_new,
            )
        outputs = tokenizer.decode_batch(out.new_tokens())
        refs = [r for r in references[start : start + batch_size] for _ in range(s.candidates)]
        scores = reward(outputs, refs).view(-1, s.candidates).tolist()
        for i, source in enumerate(texts):
            k = s.candidates
            ranked = rank_candidates(outputs[i * k : (i + 1) * k], scores[i], s.min_gap)
            if ranked is not None:
                pairs.append(PreferencePair(source, ranked[0], ranked[1]))
                chosen.append(ranked[2])
                rejected.append(ranked[3])
    summary = {
        "sources": float(len(sources)),
        "pairs": float(len(pairs)),
        f"chosen_{s.reward}": sum(chosen) / max(len(chosen), 1),
        f"rejected_{s.reward}": sum(rejected) / max(len(rejected), 1),
    }
    return pairs, summary


def write_pairs(path: Any, pairs: Sequence[PreferencePair]) -> None:
    """One JSON object a line, as `attnkit.data.preference.read_pairs` reads them."""
    lines = "".join(
        json.dumps({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}) + "\n"
        for p in pairs
    )
    atomic_write(path, lambda tmp: tmp.write_text(lines, encoding="utf-8"))
