"""Logits processors: the rules that reshape a step's scores before a token is chosen.

    repetition penalty:  s_v / r if s_v > 0 else s_v * r, for every v already seen
    no-repeat n-grams:   s_v = -inf if (y_{t-n+2..t}, v) already occurs in y
    min length, suppressed tokens, forced EOS:  s_v = -inf for the ids ruled out
    sampling warp:       softmax(s / temperature), cut to the top-k tokens and to
                         the smallest set whose probability reaches top_p

They run in Hugging Face's order and on HF's inputs (logits for greedy and
sampling, log-probabilities for beam search), so decoding agrees token for token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.generation.config import GenerationConfig


def needs_history(cfg: GenerationConfig) -> bool:
    """Whether a processor reads the ids generated so far."""
    return cfg.repetition_penalty != 1.0 or cfg.no_repeat_ngram_size > 0


def process(
    scores: Tensor,
    seqs: Tensor | None,
    real: Tensor | None,
    step: int,
    max_new: int,
    cfg: GenerationConfig,
) -> Tensor:
    """HF's logits processors, on logits (greedy, sampling) or log-probabilities (beam search).

    `seqs` (rows, length) are the ids so far (prefix included) and `real` marks
    their real tokens; both are None when no processor reads them.
    """
    if cfg.repetition_penalty != 1.0:
        seen = scores.new_zeros(scores.shape).scatter_add_(1, seqs, real.to(scores.dtype)) > 0
        penalised = torch.where(
            scores < 0, scores * cfg.repetition_penalty, scores / cfg.repetition_penalty
        )
        scores = torch.where(seen, penalised, scores)
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
