"""Attention pooling: a sentence vector as attention from one learned query over the tokens.

    u = softmax(q K^T / sqrt(d) + M) V,   K = V = H (the encoder's last hidden states)

q (d_model) is a trained parameter, the question every sentence is asked ("which tokens
matter?"); M is 0 for real tokens and -inf for padding, so padding never moves u. The
weights are one distribution over the tokens, so u is a weighted mean of the token
vectors: with q = 0 every real token weighs the same and u is mean pooling, which is
where q starts (a new attention pooling is exactly mean pooling until trained). Registered
in `attnkit.pooling` as the mode `attention`, which needs the trained module given.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnkit.errors import AttnkitError


class AttentionPooling(nn.Module):
    """(batch, length, d_model) token states and a (batch, length) mask (True for real tokens)
    -> (batch, d_model) sentence vectors, by attention from the learned `query`."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.query = nn.Parameter(torch.zeros(d_model))

    def weights(self, hidden: Tensor, mask: Tensor) -> Tensor:
        """The attention weights (batch, length): softmax over each row's real tokens."""
        if mask.shape != hidden.shape[:2]:
            raise AttnkitError(
                f"the mask has shape {tuple(mask.shape)} but the hidden states have "
                f"{tuple(hidden.shape[:2])} tokens; give one mask value per token"
            )
        scores = hidden @ self.query.to(hidden.dtype) / math.sqrt(hidden.shape[-1])
        scores = scores.masked_fill(~mask.bool(), float("-inf"))
        # a row of padding only would be 0/0: its weights are left at zero instead
        return torch.nan_to_num(scores.softmax(-1), nan=0.0)

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        return torch.einsum("bt,btd->bd", self.weights(hidden, mask), hidden)
