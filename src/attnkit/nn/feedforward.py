"""The position-wise feed-forward network (section 3.3), plain or gated.

    FFN(x) = max(0, x W_1 + b_1) W_2 + b_2                                   (eq. 2)

Applied to each position separately and identically: d_model -> d_ff -> d_model.
GELU replaces the ReLU in GPT and BERT; `gelu_tanh` is GPT-2's approximation;
SiLU (x * sigmoid(x), also called swish) is what trained Marian models use.

The gated variants (Shazeer 2020, "GLU Variants Improve Transformer") multiply
the activation by a second, linear projection of the same input:

    FFN_SwiGLU(x) = (Swish(x W) * x V) W_2        FFN_GeGLU(x) = (GELU(x W) * x V) W_2

(`geglu_tanh` is GeGLU on the tanh approximation of GELU, T5 v1.1's and Flan-T5's.)

W and V are stored as one (2 d_ff, d_model) matrix, gate rows first, so both
come from one product. LLaMA and Mistral use SwiGLU. `dropout` acts on the
hidden d_ff activations before W_2 (fairseq's and Marian's activation dropout).
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
# Each gated activation and the function applied to its gate.
GATED = {
    "swiglu": F.silu,
    "geglu": F.gelu,
    "geglu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # T5 v1.1's gated-gelu
}


class FeedForward(nn.Module):
    """FFN(x) = act(x W_1) W_2, or with a gated `activation` (act(x W) * x V) W_2."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: str = "relu",
        bias: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.gated = activation in GATED
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.w_1 = Linear(d_model, 2 * d_ff if self.gated else d_ff, bias=bias)
        self.w_2 = Linear(d_ff, d_model, bias=bias)
        self.activation = GATED[activation] if self.gated else ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        h = self.w_1(x)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            return self.w_2(self.dropout(self.activation(gate) * up))
        return self.w_2(self.dropout(self.activation(h)))
