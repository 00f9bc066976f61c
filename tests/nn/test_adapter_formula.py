"""Houlsby's adapter, h + W_up f(W_down h + b_down) + b_up with f = GELU, against a hand
computation in plain Python, number by number."""

import math

import torch

from attnkit.nn.adapters import Adapter


def _gelu(x: float) -> float:
    """GELU(x) = x Phi(x), Phi the standard normal CDF (Hendrycks and Gimpel), exactly."""
    return x * 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def test_an_adapter_computes_its_formula() -> None:
    torch.manual_seed(0)
    d, m = 5, 3
    adapter = Adapter(d, m)
    with torch.no_grad():  # W_up starts at zero: give it weights, or the formula is h alone
        for p in adapter.parameters():
            p.copy_(torch.randn_like(p))
    h = torch.randn(2, d)
    w_down, b_down = adapter.down.weight.tolist(), adapter.down.bias.tolist()
    w_up, b_up = adapter.up.weight.tolist(), adapter.up.bias.tolist()
    for row, out in zip(h.tolist(), adapter(h).tolist(), strict=True):
        inner = [_gelu(sum(w_down[j][i] * row[i] for i in range(d)) + b_down[j]) for j in range(m)]
        by_hand = [
            row[i] + sum(w_up[i][j] * inner[j] for j in range(m)) + b_up[i] for i in range(d)
        ]
        assert max(abs(a - b) for a, b in zip(out, by_hand, strict=True)) < 1e-5


def test_a_new_adapter_is_the_identity_and_has_2md_plus_m_plus_d_numbers() -> None:
    adapter = Adapter(8, 2)
    h = torch.randn(3, 8)
    assert torch.equal(adapter(h), h)
    assert sum(p.numel() for p in adapter.parameters()) == 2 * 2 * 8 + 2 + 8
