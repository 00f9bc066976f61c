"""Batched beam search, with Hugging Face's candidate selection, scoring and stopping rules.

    keep the num_beams best prefixes by  sum_t log p(y_t | y_<t, x)
    a finished hypothesis scores         sum_t log p(y_t | y_<t, x) / length^length_penalty

All sentences of a batch search at once on the model's KV cache, which is
reordered by beam at every step; a sentence leaves the batch once no running
beam can beat its finished hypotheses (on a static cache its rows stay,
decoding on unread, so that every step has the same shapes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.generation.config import GenerateOutput, GenerationConfig, on_ids, resolve
from attnkit.generation.processors import needs_history, process
from attnkit.generation.state import evaluating, prefill
from attnkit.models import TransformerModel

# Added to a score to rule a candidate out while keeping arithmetic finite, as HF does.
_EXCLUDED = -1.0e9


@torch.no_grad()
def beam_search(
    model: TransformerModel,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    config: GenerationConfig | None = None,
    **options,
) -> GenerateOutput:
    """Batched beam search with HF's candidate selection, scoring and stopping rules.

    `generate` calls it when num_beams > 1; called directly it also runs with one beam.
    """
    cfg = on_ids(resolve(config, options, model.config))
    with evaluating(model):
        return _beam_search(model, input_ids, attention_mask, cfg)


def _beam_search(
    model: TransformerModel, input_ids: Tensor, attention_mask: Tensor | None, cfg: GenerationConfig
) -> GenerateOutput:
    state, prefix, prefix_mask, max_new = prefill(model, input_ids, attention_mask, cfg)
    pad = cfg.pad_token_id
    n_sent, start = prefix.shape
    k, device = cfg.num_beams, prefix.device
    total = start + max_new
    n_keep = max(2, 1 + len(cfg.eos_ids)) * k
    top_k_mask = torch.arange(n_keep, device=device) < k
    eos = torch.tensor(cfg.eos_ids, dtype=torch.long, device=device)
    lp, early = cfg.length_penalty, cfg.early_stopping

    # Running beams of the sentences still searched; finished hypotheses of all sentences.
    run_seq = torch.full((n_sent, k, total), pad, dtype=torch.long, device=device)
    run_seq[:, :, :start] = prefix[:, None]
    run_score = torch.zeros(n_sent, k, device=device)
    run_score[:, 1:] = _EXCLUDED  # all beams start equal: only the first may expand at step 0
    fin_seq = run_seq.clone()
    fin_score = torch.full((n_sent, k), _EXCLUDED, device=device)
    fin_done = torch.zeros(n_sent, k, dtype=torch.bool, device=device)
    fin_len = torch.zeros(n_sent, k, dtype=torch.long, device=device)
    # Beams of a sentence share its prompt, so `real` (rows sentence * k + beam) never reorders.
    real = None
    if needs_history(cfg):
        real = torch.ones(n_sent * k, total, dtype=torch.bool, device=device)
        if prefix_mask is not None:
            real[:, :start] = prefix_mask.repeat_interleave(k, 0)

    # The prefix ran once per sentence; its beams share it.
    logits = state.logits.repeat_interleave(k, 0)
    state.repeat_rows(k)
    active = torch.arange(n_sent, device=device)
    try:
        for step in range(max_new):
            cur, a = start + step, len(active)
            log_probs = F.log_softmax(logits.float(), dim=-1)
            if real is not None:
                rows = (active[:, None] * k + torch.arange(k, device=device)).flatten()
                seqs = run_seq[active].flatten(0, 1)[:, :cur]
                log_probs = process(log_probs, seqs, real[rows, :cur], step, max_new, cfg)
            else:
                log_probs = process(log_probs, None, None, step, max_new, cfg)
            vocab = log_probs.shape[-1]
            scores = log_probs.view(a, k, vocab) + run_score[active][:, :, None]
            scores = scores.view(a, k * vocab)
            cand_score, cand = scores.topk(n_keep, dim=1)
            parent, token = cand // vocab, cand % vocab
            seq_a = run_seq[active]
            cand_seq = seq_a.gather(1, parent[:, :, None].expand(-1, -1, total))
            cand_seq[:, :, cur] = token
            hits = torch.isin(token, eos) | (cur + 1 >= total)

            # Beams that go on: the best k candidates that did not just finish.
            go_score = cand_score + hits.float() * _EXCLUDED
            go = go_score.topk(k, dim=1).indices
            new_run_seq = cand_seq.gather(1, go[:, :, None].expand(-1, -1, total))
            new_run_score = go_score.gather(1, go)
            new_parent = parent.gather(1, go)

            # Hypotheses that finish now: only among the best k candidates, length-penalised.
            just = hits & top_k_mask
            length = cur + 1 - start
            scored = cand_score / (length**lp) + (~just).float() * _EXCLUDED
            merged_score = torch.cat([fin_score[active], scored], dim=1)
            best = merged_score.topk(k, dim=1).indices
            fin_score[active] = merged_score.gather(1, best)
            merged_seq = torch.cat([fin_seq[active], cand_seq], dim=1)
            fin_seq[active] = merged_seq.gather(1, best[:, :, None].expand(-1, -1, total))
            fin_done[active] = torch.cat([fin_done[active], just], dim=1).gather(1, best)
            new_len = torch.full_like(cand, length)
            fin_len[active] = torch.cat([fin_len[active], new_len], dim=1).gather(1, best)
            run_seq[active], run_score[active] = new_run_seq, new_run_score

            # A sentence is done when no running beam can beat its worst finished hypothesis
            # (HF's heuristic), or, with early_stopping=True, once it has k of them.
            best_length = total - start if early == "never" and lp > 0 else cur + 1 - start
            best_running = new_run_score[:, :1] / (best_length**lp)
            done_a = fin_done[active]
            worst = torch.where(done_a, fin_score[active].min(1, keepdim=True).values, _EXCLUDED)
            open_ = (best_running > worst).any(-1) & ~(done_a.all(-1) & (early is True))
            if step == max_new - 1 or not bool(open_.any()) or bool(hits.all()):
                break
            keep = open_.nonzero().flatten()
            if state.static:
                # Rows never leave a static cache: a finished sentence's beams decode on, unread.
                rows = torch.arange(n_sent * k, device=device).view(n_sent, k)
                rows[active] = active[:, None] * k + new_parent
                active = active[keep]
                state.reorder(rows.flatten(), memory=False)
                logits = state.step(run_seq[:, :, cur].flatten()[:, None])
                logits = logits.view(n_sent, k, -1)[active].flatten(0, 1)
                continue
            dropping = len(keep) < a
            rows = (keep[:, None] * k + new_parent[keep]).flatten()
            active = active[keep]
            state.reorder(rows, memory=dropping)
            logits = state.step(run_seq[active][:, :, cur].flatten()[:, None])
    finally:  # a static cache's buffers go to the next decoding of their shape
        state.close()

    n_ret = cfg.num_return_sequences
    length = start + int(fin_len[:, :n_ret].max())
    return GenerateOutput(
        fin_seq[:, :n_ret, :length].flatten(0, 1),
        fin_score[:, :n_ret].flatten(),
        start,
        cfg.eos_ids,
    )
