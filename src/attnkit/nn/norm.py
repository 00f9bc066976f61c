"""Layer normalisation and the residual connection around each sub-layer.

The paper (section 3.1) wraps every sub-layer as

    post-LN:  x <- LayerNorm(x + Dropout(Sublayer(x)))

Pre-LN moves the norm inside the branch, leaving an identity path from input
to output, which trains deep stacks stably without a long warmup:

    pre-LN:   x <- x + Dropout(Sublayer(LayerNorm(x)))
"""

from __future__ import annotations

from torch import Tensor, nn


def make_norm(kind: str, d_model: int, eps: float, bias: bool = True) -> nn.Module:
    """The normalisation layer named by `ModelConfig.norm`."""
    if kind == "layernorm":
        return nn.LayerNorm(d_model, eps=eps, bias=bias)
    raise ValueError(f"unknown norm {kind!r}")


class Residual(nn.Module):
    """One residual connection with its norm, post-LN or pre-LN.

    A block calls `before(x)` to get the sub-layer's input and `after(x, y)`
    with the sub-layer's output `y`; the two halves keep the wiring in one
    place while the sub-layer stays free to return extra values (weights).
    """

    def __init__(self, norm: nn.Module, position: str, dropout: float) -> None:
        super().__init__()
        self.norm = norm
        self.pre = position == "pre"
        self.dropout = nn.Dropout(dropout)

    def before(self, x: Tensor) -> Tensor:
        return self.norm(x) if self.pre else x

    def after(self, x: Tensor, y: Tensor) -> Tensor:
        out = x + self.dropout(y)
        return out if self.pre else self.norm(out)
