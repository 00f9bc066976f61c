"""A nanoGPT-style GPT: the one-file model many people train first.

Written here from the architecture (pre-LN blocks, one fused c_attn
projection, SDPA with is_causal, a 4x GELU MLP, tied token embedding and
head, learned positions) so the benchmark has the loop users would
otherwise write, with nothing of attnkit inside it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _Attention(nn.Module):
    def __init__(self, d: int, heads: int, bias: bool, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.c_attn = nn.Linear(d, 3 * d, bias=bias)
        self.c_proj = nn.Linear(d, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))


class _Block(nn.Module):
    def __init__(self, d: int, heads: int, bias: bool, dropout: float) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(d, bias=bias), _Attention(d, heads, bias, dropout)
        self.ln_2 = nn.LayerNorm(d, bias=bias)
        self.mlp = nn.Sequential(
            nn.Linear(d, 4 * d, bias=bias), nn.GELU(), nn.Linear(4 * d, d, bias=bias)
        )
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.resid_dropout(self.attn(self.ln_1(x)))
        return x + self.resid_dropout(self.mlp(self.ln_2(x)))


class NanoGPT(nn.Module):
    """`bias=False` and `nanogpt_init=True` are nanoGPT's own defaults."""

    def __init__(
        self,
        vocab: int,
        block: int,
        layers: int,
        heads: int,
        d: int,
        *,
        bias: bool = True,
        nanogpt_init: bool = False,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(_Block(d, heads, bias, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, bias=bias)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        if nanogpt_init:
            # GPT-2's: N(0, 0.02) everywhere, zero biases, and the projections that end a
            # residual branch scaled down by sqrt(2 * layers).
            for module in self.modules():
                if isinstance(module, nn.Linear | nn.Embedding):
                    nn.init.normal_(module.weight, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
            for block in self.blocks:
                for last in (block.attn.c_proj, block.mlp[2]):
                    nn.init.normal_(last.weight, std=0.02 / (2 * layers) ** 0.5)

    def logits(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.logits(idx)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
