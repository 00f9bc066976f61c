"""torch.nn.Transformer with the paper's embeddings and output projection around it.

The embeddings (scaled by sqrt(d_model), plus sinusoidal positions) and the
tied head are the same as attnkit's, so the comparison measures the layers.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attnkit.nn import causal_mask, sinusoidal_table


class TorchSeq2Seq(nn.Module):
    def __init__(
        self, vocab: int, d: int, heads: int, layers: int, d_ff: int, max_len: int
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.register_buffer("pe", sinusoidal_table(max_len, d), persistent=False)
        self.transformer = nn.Transformer(
            d, heads, layers, layers, d_ff, dropout=0.0, batch_first=True
        )
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.scale = math.sqrt(d)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        x = self.embed(src) * self.scale + self.pe[: src.shape[1]]
        y = self.embed(tgt) * self.scale + self.pe[: tgt.shape[1]]
        mask = ~causal_mask(tgt.shape[1], tgt.shape[1])
        return self.head(self.transformer(x, y, tgt_mask=mask, tgt_is_causal=True))
