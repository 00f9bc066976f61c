"""Token embeddings (section 3.4).

Learned embeddings map token ids to vectors of size d_model; the paper
multiplies them by sqrt(d_model) so they are not drowned by the positional
encodings, and shares one matrix between the embedding layers and the
pre-softmax linear transformation (weight tying).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.errors import AttnkitError


class TokenEmbedding(nn.Module):
    """ids -> E[ids] * sqrt(d_model) (or unscaled, as GPT-2 and BERT)."""

    def __init__(self, vocab_size: int, d_model: int, scale: bool = True) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        # With scaling, std d^-1/2 gives unit-variance vectors after the sqrt(d) factor.
        std = d_model**-0.5 if scale else 0.02
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model).normal_(std=std))
        self.scale = math.sqrt(d_model) if scale else 1.0

    def forward(self, ids: Tensor) -> Tensor:
        check_ids(ids, self.vocab_size)
        out = F.embedding(ids, self.weight)
        return out * self.scale if self.scale != 1.0 else out


def check_ids(ids: Tensor, vocab_size: int) -> None:
    """Refuse ids outside [0, vocab_size) with a sentence rather than an index error."""
    if ids.dtype not in (torch.long, torch.int32):
        raise AttnkitError(f"token ids must be an integer tensor, got {ids.dtype}")
    # Reading the values back to Python would split a compiled graph in two; compiled code
    # keeps F.embedding's own index error instead.
    if ids.numel() == 0 or torch.compiler.is_compiling():
        return
    low, high = (int(t) for t in torch.aminmax(ids))
    if low < 0 or high >= vocab_size:
        bad = high if high >= vocab_size else low
        raise AttnkitError(
            f"token id {bad} is outside the vocabulary of {vocab_size} tokens "
            f"(ids must be in [0, {vocab_size})); check that the tokenizer matches the model"
        )
