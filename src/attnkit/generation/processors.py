"""Logits processors: the rules that reshape a step's scores before a token is chosen.

    logit bias:          s_v += b_v                            (OpenAI's logit_bias)
    repetition penalty:  s_v / r if s_v > 0 else s_v * r, for every v already seen
    presence, frequency: s_v -= [c_v > 0] * presence + c_v * frequency, c_v: v's count in
                         the output (OpenAI's penalties; the prompt not counted)
    no-repeat n-grams:   s_v = -inf if (y_{t-n+2..t}, v) already occurs in y
    min length, suppressed tokens, forced EOS:  s_v = -inf for the ids ruled out
    sampling warp:       softmax(s / temperature), cut to the top-k tokens and to
                         the smallest set whose probability reaches top_p

They run in Hugging Face's order and on HF's inputs (logits for greedy and
sampling, log-probabilities for beam search), so decoding agrees token for token;
the bias comes first, as OpenAI applies it. `generate` runs them on a whole
batch with one config, the batching engine on each row with its own
(`generation/chooser.py`): the same code.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.generation.config import GenerationConfig


def needs_history(cfg: GenerationConfig) -> bool:
    """Whether a processor reads the ids generated so far."""
    return bool(
        cfg.repetition_penalty != 1.0
        or cfg.no_repeat_ngram_size > 0
        or cfg.presence_penalty
        or cfg.frequency_penalty
    )


def process(
    scores: Tensor,
    seqs: Tensor | None,
    real: Tensor | None,
    step: int,
    max_new: int,
    cfg: GenerationConfig,
) -> Tensor:
    """HF's logits processors, on logits (greedy, sampling) or log-probabilities (beam search).

    `seqs` (rows, length) are the ids so far (prefix included, its last `step` ids the
    generated ones) and `real` marks their real tokens (None: all are); `seqs` is None
    when no processor reads it.
    """
    if cfg.logit_bias:
        ids, bias = zip(*cfg.logit_bias, strict=True)
        added = scores.new_zeros(scores.shape[-1]).index_add_(
            0, torch.tensor(ids, device=scores.device), scores.new_tensor(bias)
        )
        scores = scores + added
    if cfg.repetition_penalty != 1.0:
        weight = scores.new_ones(seqs.shape) if real is None else real.to(scores.dtype)
        seen = scores.new_zeros(scores.shape).scatter_add_(1, seqs, weight) > 0
        penalised = torch.where(
            scores < 0, scores * cfg.repetition_penalty, scores / cfg.repetition_penalty
        )
        scores = torch.where(seen, penalised, scores)
    if (cfg.presence_penalty or cfg.frequency_penalty) and step:
        output = seqs[:, seqs.shape[1] - step :]
        counts = scores.new_zeros(scores.shape).scatter_add_(
            1, output, scores.new_ones(output.shape)
        )
        scores = scores - counts * cfg.frequency_penalty - (counts > 0) * cfg.presence_penalty
    n = cfg.no_repeat_ngram_size
    if n and seqs.shape[1] >= n:
        grams = seqs.unfold(1, n, 1)  # (rows, windows, n)
        follows = (grams[:, :, :-1] == seqs[:, seqs.shape[1] - n + 1 :][:, None]).all(-1)
        banned = scores.new_zeros(scores.shape).scatter_add_(1, grams[:, :, -1], follows.float())
        scores = scores.masked_fill(banned > 0, float("-inf"))
    if step < cfg.min_new_tokens and cfg.eos_ids:
        scores = scores.index_fill(
            1, torch.tensor(cfg.eos_ids, device=scores.device), float("-inf")
        )
    if cfg.suppress_tokens:
        index = torch.tensor(cfg.suppress_tokens, device=scores.device)
        scores = scores.index_fill(1, index, float("-inf"))
    if cfg.forced_eos_token_id is not None and step == max_new - 1:
        forced = torch.full_like(scores, float("-inf"))
        forced[:, cfg.forced_eos_token_id] = 0.0
        scores = forced
    return scores


def warp(logits: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Logits of the sampling distribution: divided by temperature, cut to top-k and top-p.

    Top-p keeps the smallest set of most likely tokens whose probability
    reaches `top_p` (at least one token); the others get -inf.
    """
    if temperature != 1.0:
        logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # A token stays if the tokens ranked above it do not yet reach top_p.
        before = probs.cumsum(-1) - probs
        drop_sorted = before >= top_p
        drop = drop_sorted.scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits
