"""Segment recurrence (Transformer-XL, Dai et al. 2019): a decoder that reads a long text one
segment at a time, each segment attending to the hidden states of the one before.

For segment tau and layer l, with m_tau^(l-1) the input of layer l kept from the segments
before (its last `mem_len` positions) and SG() a stop-gradient:

    h~ = [SG(m_tau^(l-1)) ; h_tau^(l-1)]                  (memory, then the segment)
    q = h_tau^(l-1) W_q,   k = h~ W_k,   v = h~ W_v         (keys and values over both)
    h_tau^l = Block_l(h_tau^(l-1) attending to h~, causally)
    m_(tau+1)^(l-1) = the last mem_len rows of h~         (the new memory: the segment, and
                                                           older rows if mem_len > n)

so what a layer can see grows by a segment a layer: L layers reach back L segments, at the
cost of one segment of memory each. The gradient stops at the memory (it is a constant of
the current step, as in the paper), so training costs a segment's backward pass.

Positions must be relative: an absolute code would give the memory and the segment the same
positions 0..n-1. The paper's relative encoding (its u and v biases, and R_(i-j) from sines,
scores shifted per row) is replaced here by RoPE, which the project has: <R_m q, R_n k> =
<q, R_(n-m) k> depends on the distance alone, it adds no parameters, and the scores stay a
plain q k^T, so the fused attention kernels still run. The memory takes positions 0..M-1 and
the segment M..M+n-1 in each step; only their differences count. xPos and no positions
work too; sinusoidal and learned positions are refused, and so are ALiBi, T5's bias and a
window, whose masks this module does not build.

Each layer runs on the memory and the segment together, its causal mask letting a segment
position see every memory position and the segment up to itself; the memory rows' own
outputs are dropped. That spends the layer's projections and feed-forward on the memory
rows as well (about twice a segment's work at mem_len = n) in exchange for no change to
the attention layers; the results are those of the paper's formulation.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.errors import AttnkitError
from attnkit.models.base import Output
from attnkit.models.decoder_only import DecoderOnly
from attnkit.nn import AttentionInputs, AttentionPath

Memory = list[Tensor]  # one (batch, mem_len, d_model) tensor a layer: the input it read


def check_recurrent(model: DecoderOnly) -> None:
    """Refuse a model whose positions or attention cannot carry a memory."""
    c = model.config
    if c.shape != "decoder":
        raise AttnkitError(f"segment recurrence is for decoder-only models, not {c.shape}")
    if c.positional in ("sinusoidal", "learned"):
        raise AttnkitError(
            f"segment recurrence needs relative positions (rope, xpos or none), but "
            f"positional is {c.positional!r}: absolute codes would give the memory and the "
            "segment the same positions"
        )
    if c.positional in ("alibi", "t5-relative") or c.attention_window:
        raise AttnkitError(
            "segment recurrence runs the memory and the segment as one causal sequence on "
            "the fused path; use positional rope (or none) and no attention_window"
        )


def forward_segment(
    model: DecoderOnly,
    ids: Tensor,
    memory: Memory | None = None,
    mem_len: int | None = None,
    *,
    need_logits: bool = True,
) -> tuple[Output, Memory]:
    """One segment `ids` (batch, n) read after `memory` (the previous segment's, or None for
    the first): the logits of the segment (unless not `need_logits`: a fused loss projects
    the hidden states itself) and the memory for the next one, each layer's input (the memory
    it read, then the segment) over the last `mem_len` positions (default n), detached."""
    check_recurrent(model)
    n = ids.shape[1]
    mem_len = n if mem_len is None else mem_len
    held = 0 if memory is None else memory[0].shape[1]
    if memory is not None and (len(memory) != len(model.decoder.blocks) or held == 0):
        raise AttnkitError(
            f"the memory has {len(memory)} layers; this model has {len(model.decoder.blocks)}"
        )
    if held + n > model.config.max_len:
        raise AttnkitError(
            f"a memory of {held} and a segment of {n} positions exceed max_len "
            f"{model.config.max_len}; shorten mem_len or the segment, or raise max_len"
        )
    model._check(ids, None, "ids")
    h = model.embed(ids)
    positions = torch.arange(held + n, device=ids.device)[None]
    inputs = AttentionInputs(path=AttentionPath.FUSED, causal=True, positions=positions)
    new_memory: Memory = []
    for i, block in enumerate(model.decoder.blocks):
        both = h if memory is None else torch.cat((memory[i].detach().to(h.dtype), h), dim=1)
        new_memory.append(both[:, -mem_len:].detach())  # a memory longer than n keeps older rows
        h = block(both, inputs)[0][:, held:]
    if model.decoder.norm is not None:
        h = model.decoder.norm(h)
    return Output(model.head(h) if need_logits else None, h), new_memory


def forward_segments(
    model: DecoderOnly, ids: Tensor, segment: int, mem_len: int | None = None
) -> tuple[Tensor, Memory]:
    """A long `ids` (batch, length) read `segment` positions at a time, each segment after the
    memory of the one before: the logits of every position and the last memory."""
    logits, memory = [], None
    for start in range(0, ids.shape[1], segment):
        out, memory = forward_segment(model, ids[:, start : start + segment], memory, mem_len)
        logits.append(out.logits)
    return torch.cat(logits, dim=1), memory
