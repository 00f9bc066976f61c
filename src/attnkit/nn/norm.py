"""Layer normalisation and the residual connection around each sub-layer.

The paper (section 3.1) wraps every sub-layer as

    post-LN:  x <- LayerNorm(x + Dropout(Sublayer(x)))

Pre-LN moves the norm inside the branch, leaving an identity path from input
to output, which trains deep stacks stably without a long warmup:

    pre-LN:   x <- x + Dropout(Sublayer(LayerNorm(x)))

DeepNorm (Wang et al. 2022, "DeepNet") keeps post-LN's placement but weighs
the residual by alpha > 1 and starts the sub-layers' value, output and
feed-forward weights scaled down by beta < 1, which bounds the update of the
model early in training however deep the stack:

    DeepNorm: x <- LayerNorm(alpha x + Dropout(Sublayer(x)))

RMSNorm (Zhang and Sennrich 2019) drops LayerNorm's centring and bias:

    RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g
"""

from __future__ import annotations

from torch import Tensor, nn


def make_norm(kind: str, d_model: int, eps: float, bias: bool = True) -> nn.Module:
    """The normalisation layer named by `ModelConfig.norm`."""
    if kind == "layernorm":
        return nn.LayerNorm(d_model, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return nn.RMSNorm(d_model, eps=eps)
    raise ValueError(f"unknown norm {kind!r}")


def deepnorm_constants(
    n_encoder_layers: int, n_decoder_layers: int
) -> dict[str, tuple[float, float]]:
    """DeepNet's (alpha, beta) for the "encoder" and "decoder" stacks (the paper's table 1).

    N encoder and M decoder layers; a single stack of L layers uses
    alpha = (2L)^(1/4), beta = (8L)^(-1/4).
    """
    n, m = n_encoder_layers, n_decoder_layers
    if n and m:
        return {
            "encoder": (0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)),
            "decoder": ((3 * m) ** (1 / 4), (12 * m) ** (-1 / 4)),
        }
    layers = n or m
    single = ((2 * layers) ** (1 / 4), (8 * layers) ** (-1 / 4))
    return {"encoder": single, "decoder": single}


class Residual(nn.Module):
    """One residual connection with its norm: post-LN, pre-LN or DeepNorm (with `alpha`).

    A block calls `before(x)` to get the sub-layer's input and `after(x, y)`
    with the sub-layer's output `y`; the two halves keep the wiring in one
    place while the sub-layer stays free to return extra values (weights).
    """

    def __init__(self, norm: nn.Module, position: str, dropout: float, alpha: float = 1.0) -> None:
        super().__init__()
        self.norm = norm
        self.pre = position == "pre"
        self.alpha = alpha
        self.dropout = nn.Dropout(dropout)

    def before(self, x: Tensor) -> Tensor:
        return self.norm(x) if self.pre else x

    def after(self, x: Tensor, y: Tensor) -> Tensor:
        if self.pre:
            return x + self.dropout(y)
        if self.alpha != 1.0:
            x = x * self.alpha
        return self.norm(x + self.dropout(y))
