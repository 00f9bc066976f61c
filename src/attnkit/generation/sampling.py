"""Greedy and sampled decoding, one token per row per step, as a stream.

    greedy:    y_t = argmax_v p(v | y_<t, x)
    sampling:  y_t ~ softmax(logits / temperature), restricted to the top-k
               tokens and to the smallest set whose probability reaches top_p

Rows leave the batch as soon as they emit EOS. A decoder-only model that runs
past its max_len goes on conditioned on its last max_len tokens (nanoGPT's crop).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from attnkit.errors import AttnkitError
from attnkit.generation.config import GenerationConfig, on_ids, resolve
from attnkit.generation.processors import needs_history, process, warp
from attnkit.generation.state import Cached, evaluating, prefill
from attnkit.models import TransformerModel

# Steps between two looks at whether every row of a static-cache decode has finished.
STATIC_CHECK = 8


def _token_steps(
    model: TransformerModel, input_ids: Tensor, attention_mask: Tensor | None, cfg: GenerationConfig
) -> Iterator[Tensor]:
    """Greedy or sampled decoding; yields each step's ids (batch,), padding for finished rows."""
    if cfg.num_return_sequences > 1:
        input_ids = input_ids.repeat_interleave(cfg.num_return_sequences, 0)
        if attention_mask is not None:
            attention_mask = attention_mask.repeat_interleave(cfg.num_return_sequences, 0)
    crop = cfg.crop_context and model.config.shape == "decoder"
    state, prefix, prefix_mask, max_new = prefill(model, input_ids, attention_mask, cfg, crop)
    pad = cfg.pad_token_id
    batch, start = prefix.shape
    device = prefix.device
    max_len = model.config.max_len
    crops = start + max_new > max_len
    history = needs_history(cfg) or crops
    if history:
        seqs = torch.full((batch, start + max_new), pad, dtype=torch.long, device=device)
        seqs[:, :start] = prefix
        real = torch.ones_like(seqs, dtype=torch.bool)
        if prefix_mask is not None:
            real[:, :start] = prefix_mask
    eos = torch.tensor(cfg.eos_ids, dtype=torch.long, device=device)
    generator = None
    if cfg.do_sample and cfg.seed is not None:
        generator = torch.Generator(device).manual_seed(cfg.seed)
    active = torch.arange(batch, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    logits = state.logits
    try:
        for step in range(max_new):
            cur = start + step
            ctx = (seqs[active, :cur], real[active, :cur]) if history else (None, None)
            scores = process(logits.float(), *ctx, step, max_new, cfg)
            if cfg.do_sample:
                probs = warp(scores, cfg.temperature, cfg.top_k, cfg.top_p).softmax(-1)
                next_ids = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            else:
                next_ids = scores.argmax(-1)
            if history:
                seqs[active, cur] = next_ids
            if state.static:  # rows never leave a static cache: a finished row yields padding
                next_ids = next_ids.masked_fill_(done, pad)
                yield next_ids
                done |= torch.isin(next_ids, eos)
                # Reading `done` waits for the device, so a graph-replayed loop looks now and then.
                if step == max_new - 1 or (step % STATIC_CHECK == 0 and bool(done.all())):
                    return
                if cur + 1 <= max_len:
                    logits = state.step(next_ids[:, None])
                    continue
                # `auto` took the static cache while max_len held the decode; the crop goes on,
                # on the dynamic cache, without the rows that have finished.
                keep = (~done).nonzero().flatten()
                if keep.numel() == 0:
                    return
                active = active[keep]
                lo = cur + 1 - max_len
                ids, mask = seqs[active, lo : cur + 1], real[active, lo : cur + 1]
                full, state = state, Cached(model, ids, mask, ids, mask, max_len)
                full.close()
                logits = state.logits
                continue
            out = torch.full((batch,), pad, dtype=torch.long, device=device)
            out[active] = next_ids
            yield out
            if step == max_new - 1:
                return
            finished = torch.isin(next_ids, eos)
            if bool(finished.any()):
                keep = (~finished).nonzero().flatten()
                if keep.numel() == 0:
                    return
                active, next_ids = active[keep], next_ids[keep]
                state.reorder(keep, memory=True)
            if cur + 1 > max_len:
                # The cache is full: rerun the last max_len tokens, as nanoGPT does at every step.
                # Learned positions stop at max_len, so the cache cannot simply roll on.
                lo = cur + 1 - max_len
                ids, mask = seqs[active, lo : cur + 1], real[active, lo : cur + 1]
                state = type(state)(model, ids, mask, ids, mask, max_len)
                logits = state.logits
            else:
                logits = state.step(next_ids[:, None])
    finally:  # a static cache's buffers go to the next decoding of their shape
        state.close()


def stream(
    model: TransformerModel,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    config: GenerationConfig | None = None,
    **options,
) -> Iterator[Tensor]:
    """Greedy or sampled decoding as an iterator: yields (batch,) new ids per step.

    Finished rows yield padding; the iterator ends when every row is finished
    or after max_new_tokens steps. Options are those of `GenerationConfig`.
    """
    cfg = on_ids(resolve(config, options, model.config))
    if cfg.num_beams > 1:
        raise AttnkitError(
            "beam search cannot stream: its best hypothesis is known only at the end"
        )
    with evaluating(model), torch.no_grad():
        yield from _token_steps(model, input_ids, attention_mask, cfg)
