"""Positions concatenated to the token embeddings instead of added to them.

The paper adds (section 3.5): x = E[id] sqrt(d) + PE[pos], so a token's vector and
its position share the same d_model dimensions, and the model must learn to keep
them apart. Concatenating gives each its own dimensions and lets a learned matrix
mix them back to the model's width:

    x = [E[id] sqrt(d) ; PE[pos]] W_c,      W_c in R^{2 d_model x d_model}

The paper's remark that the two are summed "so that [they] can be summed" is the
other choice: concatenation costs 2 d_model^2 weights and one product per token,
and with W_c = [I; I] it is addition again, so it can only learn more.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.nn.linear import Linear


class ConcatPositions(nn.Module):
    """[x ; p] -> d_model, by one learned projection (`bias` as the model's linear layers)."""

    def __init__(self, d_model: int, bias: bool = True) -> None:
        super().__init__()
        self.proj = Linear(2 * d_model, d_model, bias=bias)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """x (batch, length, d_model) and their position vectors (batch or 1, length, d_model)."""
        return self.proj(torch.cat((x, positions.expand_as(x)), dim=-1))
