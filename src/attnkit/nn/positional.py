"""Positional encodings: where each token stands in its sequence.

Sinusoidal (section 3.5), fixed and defined for any position:

    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

Marian keeps the same frequencies but lays the table out `split`: all the sines
in the first d_model/2 dimensions, all the cosines in the second half.

Learned: one trained vector per position, as in GPT-2 and BERT. Both are added
to the scaled token embeddings; `positions` lets a left-padded batch start
each sequence at position 0.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_table(max_len: int, d_model: int, layout: str = "interleaved") -> Tensor:
    """The (max_len, d_model) table of PE(pos, 2i) and PE(pos, 2i+1), `interleaved` or `split`."""
    position = torch.arange(max_len, dtype=torch.float64)[:, None]
    # 1 / 10000^(2i/d) computed as exp(-2i ln(10000) / d), in float64 for exactness.
    inv_freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model)
    )
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    sin_dims, cos_dims = (
        (slice(0, None, 2), slice(1, None, 2))
        if layout == "interleaved"
        else (slice(0, (d_model + 1) // 2), slice((d_model + 1) // 2, None))
    )
    table[:, sin_dims] = torch.sin(position * inv_freq)
    table[:, cos_dims] = torch.cos(position * inv_freq[: d_model // 2])
    return table.float()


class AbsolutePositions(nn.Module):
    """Adds a position vector to each input vector: x + PE[positions]."""

    def __init__(
        self, max_len: int, d_model: int, learned: bool, layout: str = "interleaved"
    ) -> None:
        super().__init__()
        self.max_len = max_len
        if learned:
            self.table = nn.Parameter(torch.empty(max_len, d_model).normal_(std=0.02))
        else:
            # A buffer, not a parameter: fixed, and not saved (it is a function of the shape).
            table = sinusoidal_table(max_len, d_model, layout)
            self.register_buffer("table", table, persistent=False)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """x: (batch, length, d_model); positions: (batch or 1, length), default 0..length-1.

        The model checks lengths against max_len before it gets here.
        """
        if positions is None:
            return x + self.table[: x.shape[1]]
        return x + self.table[positions]
