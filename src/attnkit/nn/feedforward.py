"""The position-wise feed-forward network (section 3.3).

    FFN(x) = max(0, x W_1 + b_1) W_2 + b_2                                   (eq. 2)

Applied to each position separately and identically: d_model -> d_ff -> d_model.
GELU replaces the ReLU in GPT and BERT; `gelu_tanh` is GPT-2's approximation;
SiLU (x * sigmoid(x), also called swish) is what trained Marian models use.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.nn.linear import Linear

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


class FeedForward(nn.Module):
    def __init__(
        self, d_model: int, d_ff: int, activation: str = "relu", bias: bool = True
    ) -> None:
        super().__init__()
        self.w_1 = Linear(d_model, d_ff, bias=bias)
        self.w_2 = Linear(d_ff, d_model, bias=bias)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.activation(self.w_1(x)))
