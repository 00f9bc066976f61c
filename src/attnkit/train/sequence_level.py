"""Sequence-level training: optimise a metric such as BLEU, which has no gradient, as a reward.

The decoder is a policy that emits a whole output y for a source x. For each
source, K candidates y_1 .. y_K are decoded inside training (by the generation
code, on the KV cache, without dropout) and scored by a sentence reward r(y)
(`train/rewards.py`). With log p(y) = sum_t log p(y_t | y_<t, x):

    REINFORCE, self-critical   L = -1/K sum_k (r(y_k) - r(y_greedy)) log p(y_k)
        (Rennie et al., 2017: the baseline is the reward of the greedy output)
    REINFORCE, leave-one-out   L = -1/K sum_k (r(y_k) - mean_{j != k} r(y_j)) log p(y_k)
    minimum risk               L = sum_k Q(y_k) (1 - r(y_k)),
                               Q(y_k) = p(y_k)^alpha / sum_j p(y_j)^alpha   over distinct y_k
        (Shen et al., 2016; the "risk" loss of Edunov et al., 2018)

averaged over the sources of the batch. Pure sequence-level training drifts into
degenerate output, so the trained loss mixes in the token-level cross-entropy:
mle_weight * L_CE + (1 - mle_weight) * L. Candidates are sampled (temperature),
or for minimum risk may be the K best of a beam search. For a language model,
the first `prompt_fraction` of each block is the prompt and the rest is the
reference its continuation is scored against. In evaluation the objective is
the plain cross-entropy, so validation losses compare.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.checks import check, choice, finite_fields, positive, within
from attnkit.data.batch import Batch
from attnkit.generation import GenerateOutput, GenerationConfig, generate
from attnkit.generation.state import evaluating, left_pad
from attnkit.models.base import unwrap
from attnkit.train.cross_entropy import IGNORE, LossTerms
from attnkit.train.objectives import NextTokenObjective, Objective
from attnkit.train.rewards import REWARDS, SentenceReward

KINDS = ("off", "self-critical", "reinforce", "risk")
SEARCHES = ("sample", "beam")


@dataclass(frozen=True)
class SequenceLossSection:
    """The [sequence_loss] section of a run config; `kind = "off"` (the default) trains on the
    cross-entropy alone.

    kind: `self-critical`, `reinforce` (leave-one-out baseline) or `risk` (minimum risk).
    reward: `bleu` or `chrf`, sacreBLEU's sentence scores.
    lowercase: score the lowercased output against the lowercased reference.
    candidates: K, the outputs decoded per source.
    search: `sample` (at `temperature`) or, for `risk`, `beam` (the K best of a beam of K).
    temperature: of the softmax the candidates are sampled from.
    alpha: the sharpness of minimum risk's distribution Q over the candidates: 1 is the
        model's own distribution renormalised over them (Edunov et al.); Shen et al. use
        0.005 over 100 samples, which makes Q nearly uniform.
    mle_weight: the weight of the cross-entropy in the trained loss, in [0, 1).
    prompt_fraction: a language model's share of each block given as the prompt.
    """

    kind: str = "off"
    reward: str = "bleu"
    lowercase: bool = False
    candidates: int = 4
    search: str = "sample"
    temperature: float = 1.0
    alpha: float = 1.0
    mle_weight: float = 0.3
    prompt_fraction: float = 0.5

    def __post_init__(self) -> None:
        s = "sequence_loss"
        finite_fields(self, s)
        choice(f"{s}.kind", self.kind, KINDS)
        choice(f"{s}.reward", self.reward, REWARDS)
        choice(f"{s}.search", self.search, SEARCHES)
        positive(f"{s}.candidates", self.candidates)
        positive(f"{s}.temperature", self.temperature)
        positive(f"{s}.alpha", self.alpha)
        within(f"{s}.mle_weight", self.mle_weight, "[0, 1)")
        within(f"{s}.prompt_fraction", self.prompt_fraction, "(0, 1)")
        check(
            self.search == "sample" or self.kind == "risk",
            f"{s}.search 'beam' needs {s}.kind 'risk': REINFORCE needs sampled outputs",
        )
        check(
            self.kind not in ("reinforce", "risk") or self.candidates >= 2,
            f"{s}.kind {self.kind!r} compares candidates, so it needs {s}.candidates >= 2",
        )

    @property
    def on(self) -> bool:
        return self.kind != "off"


def policy_gradient_loss(log_probs: Tensor, rewards: Tensor, baseline: Tensor) -> Tensor:
    """REINFORCE with a baseline, per source: -mean_k (r_k - b_k) log p(y_k); inputs (n, K)."""
    advantage = (rewards - baseline).to(log_probs.dtype)
    return -(advantage * log_probs).mean(-1)


def leave_one_out(rewards: Tensor) -> Tensor:
    """Each candidate's baseline: the mean reward of the other K - 1 of its source; (n, K)."""
    k = rewards.shape[-1]
    return (rewards.sum(-1, keepdim=True) - rewards) / (k - 1)


def risk(log_probs: Tensor, rewards: Tensor, alpha: float, distinct: Tensor) -> Tensor:
    """Minimum risk per source: sum_k Q_k (1 - r_k), Q = softmax(alpha log p) over the
    `distinct` candidates (a repeated output counts once); inputs (n, K)."""
    scores = (alpha * log_probs).masked_fill(~distinct, -math.inf)
    q = scores.softmax(-1)
    return (q * (1 - rewards.to(q.dtype))).sum(-1)


def first_occurrences(rows: list[list[int]], k: int) -> Tensor:
    """(n, K) True for the first of equal outputs among each source's K candidates."""
    keep = []
    for start in range(0, len(rows), k):
        seen: set[tuple[int, ...]] = set()
        for row in rows[start : start + k]:
            keep.append(tuple(row) not in seen)
            seen.add(tuple(row))
    return torch.tensor(keep).view(-1, k)


@dataclass
class Prompts:
    """What the decoder is given and what its outputs are scored against, one row a source."""

    inputs: Tensor  # sources of an encoder-decoder, prompts of a language model
    mask: Tensor | None
    references: list[str]  # detokenized, as the rewards read them
    max_new_tokens: int
    eos: tuple[int, ...] | None  # None: the model's EOS; (): decode max_new_tokens exactly


class SequenceLevel(Objective):
    """Wraps a next-token objective (translation, language model) with a sequence-level loss."""

    one_forward = False  # the cross-entropy's pass and the candidates' pass

    def __init__(
        self, base: NextTokenObjective, section: SequenceLossSection, tokenizer: object
    ) -> None:
        super().__init__(base.label_smoothing)
        self.base, self.section, self.tokenizer = base, section, tokenizer
        self.task = base.task
        self.reward = SentenceReward(section.reward, section.lowercase)

    def use_head_loss(self, head_loss: Callable[..., LossTerms]) -> None:
        self.base.use_head_loss(head_loss)  # the likelihood term is the base objective's

    def __call__(self, model: nn.Module, batch: Batch) -> LossTerms:
        if not model.training:
            return self.base(model, batch)
        s = self.section
        # With gradient even at mle_weight 0: a mixture of experts' balancing loss rides on it.
        terms = self.base(model, batch)
        plain = unwrap(model)
        prompts = self.prompts(batch, plain.config.max_len)
        outputs = self.candidates(plain, prompts)
        log_probs = self.log_probs(model, prompts, batch, outputs).view(-1, s.candidates)
        generated = outputs.new_tokens()
        rewards = self.score(generated, prompts.references, s.candidates).to(log_probs)
        if s.kind == "risk":
            distinct = first_occurrences(generated, s.candidates)
            loss = risk(log_probs, rewards, s.alpha, distinct.to(log_probs.device))
        else:
            if s.kind == "self-critical":
                greedy = self.decode(plain, prompts, GenerationConfig())
                baseline = self.score(greedy.new_tokens(), prompts.references, 1).to(log_probs)
            else:
                baseline = leave_one_out(rewards)
            loss = policy_gradient_loss(log_probs, rewards, baseline)
        terms.sequence = (1 - s.mle_weight) * loss.mean() * terms.tokens
        terms.reward = rewards.detach().mean(-1).sum()
        terms.sources = terms.loss.new_tensor(float(rewards.shape[0]))
        terms.loss_weight = s.mle_weight
        return terms

    def predict(self, model: nn.Module, batch: Batch) -> tuple[Tensor, Tensor]:
        return self.base.predict(model, batch)

    def prompts(self, batch: Batch, max_len: int) -> Prompts:
        """The sources (or a language model's prompts) of `batch` and their references; an
        output may be 2·len(reference) + 10 tokens long, within the model's `max_len`."""
        eos = getattr(self.tokenizer, "eos_id", None)
        if batch.src is not None:  # the target rows are <s> y_1 .. y_n </s> <pad> ..
            references = [_strip(row, eos) for row in _rows(batch.tgt, batch.tgt_mask)]
            longest = max(len(r) for r in references)
            room = min(2 * longest + 10, max_len - 1)  # after the start token
            texts = self.tokenizer.decode_batch(references)
            return Prompts(batch.src, batch.src_mask, texts, room, None)
        length = batch.tgt.shape[1]
        cut = min(max(1, int(length * self.section.prompt_fraction)), length - 1)
        return Prompts(
            batch.tgt[:, :cut],
            None if batch.tgt_mask is None else batch.tgt_mask[:, :cut],
            self.tokenizer.decode_batch(batch.tgt[:, cut:].tolist()),
            length - cut,
            (),
        )

    def candidates(self, model: nn.Module, prompts: Prompts) -> GenerateOutput:
        """K outputs per source, rows grouped by source: sampled, or a beam's K best."""
        s = self.section
        if s.search == "beam":
            options = GenerationConfig(num_beams=s.candidates, num_return_sequences=s.candidates)
        else:
            options = GenerationConfig(
                do_sample=True, temperature=s.temperature, num_return_sequences=s.candidates
            )
        return self.decode(model, prompts, options)

    def decode(
        self, model: nn.Module, prompts: Prompts, options: GenerationConfig
    ) -> GenerateOutput:
        """The project's `generate` on the KV cache, in evaluation mode (no dropout)."""
        extra = {} if prompts.eos is None else {"eos_token_id": prompts.eos}
        with evaluating(model):
            return generate(
                model,
                prompts.inputs,
                prompts.mask,
                options,
                max_new_tokens=prompts.max_new_tokens,
                **extra,
            )

    def score(self, generated: list[list[int]], references: list[str], k: int) -> Tensor:
        """(sources, k) rewards of the generated ids, k per source, against the references."""
        hypotheses = self.tokenizer.decode_batch(generated)
        repeated = [text for text in references for _ in range(k)]
        return self.reward(hypotheses, repeated).view(-1, k)

    def log_probs(
        self, model: nn.Module, prompts: Prompts, batch: Batch, outputs: GenerateOutput
    ) -> Tensor:
        """log p(y) of each output (rows of `outputs.sequences`), with gradient: its generated
        tokens up to and including the first EOS, read by a teacher-forced pass in training
        mode (dropout on, as every training pass). REINFORCE scores them under the policy they
        were sampled from, softmax(z / temperature); minimum risk under the model itself."""
        s = self.section
        k = s.candidates
        sequences, start = outputs.sequences, outputs.prefix_length
        generated = sequences[:, start:]
        is_eos = torch.isin(generated, torch.tensor(outputs.eos_token_ids or [-1]).to(generated))
        after_eos = (is_eos.long().cumsum(1) - is_eos.long()) > 0
        if batch.src is not None or prompts.mask is None:  # <s>, or a prompt without padding
            prefix_mask = torch.ones_like(sequences[:, :start], dtype=torch.bool)
        else:  # the prompt as generate laid it out, its padding moved to the left
            prefix_mask = left_pad(prompts.inputs, prompts.mask)[1].repeat_interleave(k, 0)
        real = torch.cat([prefix_mask, ~after_eos], 1)
        candidates = Batch(batch.src, batch.src_mask, sequences, real)  # k rows per source
        dec_in, dec_mask, targets = self.base.teacher_forced(candidates)
        targets[:, : start - 1] = IGNORE  # a language model's prompt is given, not generated
        hidden = self.base.run(model, candidates, dec_in, dec_mask, repeat=k)
        # Only the scored positions reach the head: (tokens, vocabulary) logits, no padding.
        kept = targets != IGNORE
        logits = unwrap(model).head(hidden[kept]).float()
        if s.kind != "risk":
            logits = logits / s.temperature
        nll = F.cross_entropy(logits, targets[kept], reduction="none")
        rows = torch.arange(len(targets), device=targets.device)[:, None].expand_as(targets)
        return -torch.zeros(len(targets), device=nll.device).index_add(0, rows[kept], nll)


def _rows(ids: Tensor, mask: Tensor | None) -> list[list[int]]:
    rows = ids.tolist()
    if mask is None:
        return rows
    return [row[:n] for row, n in zip(rows, mask.sum(-1).tolist(), strict=True)]


def _strip(row: list[int], eos: int | None) -> list[int]:
    """A target row without its start token and what follows its EOS."""
    row = row[1:]
    return row[: row.index(eos)] if eos in row else row
