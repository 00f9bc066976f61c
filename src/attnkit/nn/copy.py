"""The pointer-generator (See et al., 2017): a step generates a word or copies one from the source.

    P(w) = p_gen P_vocab(w) + (1 - p_gen) sum_{i: x_i = w} a_i
    p_gen = sigmoid(w_c . c_t + w_s . s_t + w_x . x_t + b),      c_t = sum_i a_i h_i

a_t is the copy attention of step t over the source positions i, h_i the
encoder output (the memory), s_t the decoder's last hidden state, x_t the
embedding of the decoder's input and P_vocab the softmax of the output layer.
See et al. have one attention; a Transformer has one per head and layer, so
the copy attention is a documented choice: the last decoder layer's
cross-attention averaged over its heads (`copy_attention = "mean"`), or its
first head alone (`"head"`), a head that learns to point while the others
attend as they like.

A source word the vocabulary lacks has an id past it, V + i for the i-th
distinct unknown word of its sentence (`data/extended.py`): only copying can
produce it, and the embeddings read it as <unk>. P spans V plus as many extra
ids as the sentence of the batch with the most unknown words needs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.errors import AttnkitError
from attnkit.nn.linear import Linear


class PointerGenerator(nn.Module):
    """The gate p_gen and the mixture of generating and copying, for an encoder-decoder."""

    def __init__(self, d_model: int, vocab_size: int, unk_id: int | None, attention: str) -> None:
        super().__init__()
        if unk_id is None:
            raise AttnkitError(
                "a pointer-generator reads unknown words as <unk>, but the model config has no "
                "unk_id; set unk_id to the tokenizer's <unk> id"
            )
        self.vocab_size, self.unk_id, self.attention = vocab_size, unk_id, attention
        # One row over [c_t; s_t; x_t] is w_c, w_s and w_x side by side.
        self.gate = Linear(3 * d_model, 1)

    def in_vocab(self, ids: Tensor) -> Tensor:
        """Extended ids as the embeddings read them: every id past the vocabulary is <unk>."""
        return ids.masked_fill(ids >= self.vocab_size, self.unk_id)

    def copy_weights(self, weights: Tensor) -> Tensor:
        """a_t (batch, T, S) from one layer's cross-attention weights (batch, heads, T, S)."""
        return weights.mean(1) if self.attention == "mean" else weights[:, 0]

    def forward(
        self,
        logits: Tensor,
        state: Tensor,
        inputs: Tensor,
        weights: Tensor,
        memory: Tensor,
        source_ids: Tensor,
    ) -> Tensor:
        """log P(w) over the extended vocabulary, (batch, T, V + extra), in float32.

        logits (batch, T, V) of the output layer; state s_t and inputs x_t (batch,
        T, d_model); weights the copy layer's cross-attention (batch, heads, T, S);
        memory h (batch / group, S, d_model) and source_ids (batch / group, S) in the
        extended vocabulary, shared by `group` consecutive rows (the beams of a
        sentence) as the decoding cache shares them.
        """
        a = self.copy_weights(weights).float()
        group = a.shape[0] // memory.shape[0]
        # c_t = sum_i a_i h_i, the rows of a group against their one memory in one product.
        rows = a.unflatten(0, (-1, group)).flatten(1, 2)
        context = (rows @ memory.float()).unflatten(1, (group, -1)).flatten(0, 1)
        gate_in = torch.cat([context, state.float(), inputs.float()], -1)
        dtype = next(self.gate.parameters()).dtype  # the gate may be wrapped (LoRA)
        p_gen = torch.sigmoid(self.gate(gate_in.to(dtype)).float())
        extra = max(0, int(source_ids.max()) + 1 - self.vocab_size)
        p = F.pad(p_gen * logits.float().softmax(-1), (0, extra))
        index = source_ids.repeat_interleave(group, 0)[:, None].expand(-1, a.shape[1], -1)
        # Padding positions carry no attention, so their ids add nothing.
        p = p.scatter_add(-1, index, (1 - p_gen) * a)
        # An extra id that no source of the row has is impossible: log 0 = -inf, kept
        # finite so that its (zero) gradient does not turn into 0 * inf = NaN.
        return p.clamp_min(torch.finfo(p.dtype).tiny).log()
