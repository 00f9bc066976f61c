"""Positional encodings: where each token stands in its sequence.

Sinusoidal (section 3.5), fixed and defined for any position:

    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

Marian keeps the same frequencies but lays the table out `split`: all the sines
in the first d_model/2 dimensions, all the cosines in the second half.

Learned: one trained vector per position, as in GPT-2 and BERT. Both are added
to the scaled token embeddings, times an amplitude a (`positional_scale`, 1 in the
paper): x = E[ids] sqrt(d_model) + a PE[pos]; `positions` lets a left-padded batch start
each sequence at position 0. Position interpolation (`positional_interpolation` s) reads
sinusoidal position p as p / s, between the positions a model trained on.

The two relative schemes act inside attention instead, so that a score
depends on how far apart a query and a key are, not on where they stand:

RoPE (Su et al. 2021) turns each pair (x_i, x_{i+d/2}) of a query or key at
position m by the angle m * theta_i, theta_i = theta^(-2i/d), so that

    <R_m q, R_n k> = <q, R_{n-m} k>

Three ways stretch it to s times the trained length (`rope_frequencies`):
NTK-aware scaling raises the base to theta * s^(d/(d-2)): the slowest pair
then turns s times slower while the fastest, which tell near neighbours
apart, hardly change. Linear scaling (position interpolation, Chen et al.
2023) divides every frequency by s. Llama 3.1's divides by s only the pairs
whose wavelength 2 pi / theta_i exceeds the trained length L, keeps those
shorter than L / 4, and blends the two in between.

xPos (Sun et al. 2022) is RoPE with a decay: pair i of a query at m is also
scaled by zeta_i^(m / B) and of a key at n by zeta_i^(-n / B), with
zeta_i = (2i/d + 0.4) / 1.4 and B = `xpos_scale_base` (512), so that

    <q_m, k_n> = sum_i zeta_i^((m - n) / B) <R_m q, R_n k>_i

still depends on m - n alone, and the fast-turning pairs (small zeta_i) fade
with distance, which is what lets a model trained short read longer text.

ALiBi (Press et al. 2022) adds -m_h |i - j| to the score of query i and key j,
with head h's slope m_h from a geometric sequence: 2^(-8/n), 2^(-16/n), ...
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn


def sinusoidal_table(
    max_len: int,
    d_model: int,
    layout: str = "interleaved",
    dtype: torch.dtype = torch.float32,
    interpolation: float = 1.0,
) -> Tensor:
    """The (max_len, d_model) table of PE(pos, 2i) and PE(pos, 2i+1), `interleaved` or `split`,
    computed in float64 and given in `dtype`; row p holds PE(p / interpolation)."""
    # Position interpolation: s max_len positions squeezed into the max_len / s trained on.
    position = torch.arange(max_len, dtype=torch.float64)[:, None] / interpolation
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
    return table.to(dtype)


# Llama 3.1's scaling keeps the pairs of wavelength under L / HIGH_FREQ_FACTOR and divides
# those over L / LOW_FREQ_FACTOR by s (the values of every Llama 3.x release).
LOW_FREQ_FACTOR, HIGH_FREQ_FACTOR = 1.0, 4.0


def rope_frequencies(
    d_head: int,
    theta: float = 10000.0,
    scaling: float = 1.0,
    kind: str = "ntk",
    original_max_len: int = 0,
) -> Tensor:
    """theta_i of each pair i < d_head / 2, in float64, stretched `scaling` times by `kind`."""
    exponent = -torch.arange(0, d_head, 2, dtype=torch.float64) / d_head
    if kind == "ntk":
        return (theta * scaling ** (d_head / (d_head - 2))) ** exponent
    freq = theta**exponent
    if kind == "linear":
        return freq / scaling
    # llama3: by wavelength against the trained length L, divided by s, kept, or blended
    # with a weight that goes from 0 at wavelength L to 1 at L / 4.
    turns_in_context = original_max_len * freq / (2 * math.pi)  # L / wavelength
    keep = (turns_in_context - LOW_FREQ_FACTOR) / (HIGH_FREQ_FACTOR - LOW_FREQ_FACTOR)
    keep = keep.clamp(0.0, 1.0)
    return (1 - keep) * freq / scaling + keep * freq


class RotaryEmbedding(nn.Module):
    """RoPE: rotates queries and keys by their positions (the `Rotary` hook of attention).

    Pairs are (x_i, x_{i + d/2}), the "half" layout of GPT-NeoX and LLaMA in
    Hugging Face; one instance serves every layer of a model. The frequencies
    come from `rope_frequencies` (its keyword arguments pass through).
    """

    def __init__(self, d_head: int, max_len: int, theta: float = 10000.0, **scaling: Any) -> None:
        super().__init__()
        inv_freq = rope_frequencies(d_head, theta, **scaling)
        angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq
        # Tables, not parameters: fixed functions of the shape, so not saved.
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def tables(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos and sin of the angles at positions (batch or 1, length), shaped to broadcast
        over (batch, heads, length, d_head / 2)."""
        return self.cos[positions][:, None], self.sin[positions][:, None]

    def forward(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        q_tables = self.tables(q_pos)
        # Self-attention passes one positions tensor for both: look the angles up once.
        k_tables = q_tables if k_pos is q_pos else self.tables(k_pos)
        return _rotate(q, *q_tables), _rotate(k, *k_tables)


# xPos's gamma: zeta_i = (2i/d + gamma) / (1 + gamma), from 0.29 for the fastest pair to ~1.
XPOS_GAMMA = 0.4


class XPos(RotaryEmbedding):
    """xPos: RoPE whose queries grow by zeta_i^(m/B) and keys shrink by zeta_i^(-n/B).

    The scales are folded into each side's cos and sin tables, so the cost is
    RoPE's. Keys are scaled at their own position when they enter the KV cache,
    so cached decoding computes the same scores.
    """

    def __init__(
        self, d_head: int, max_len: int, theta: float = 10000.0, scale_base: float = 512.0, **rope
    ) -> None:
        super().__init__(d_head, max_len, theta, **rope)
        pairs = torch.arange(0, d_head, 2, dtype=torch.float64)
        zeta = (pairs / d_head + XPOS_GAMMA) / (1 + XPOS_GAMMA)
        powers = torch.arange(max_len, dtype=torch.float64)[:, None] / scale_base
        self.register_buffer("scale", (zeta**powers).float(), persistent=False)

    def forward(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        (q_cos, q_sin), (k_cos, k_sin) = self.tables(q_pos), self.tables(k_pos)
        q_scale, k_scale = self.scale[q_pos][:, None], self.scale[k_pos][:, None]
        q = _rotate(q, q_cos * q_scale, q_sin * q_scale)
        return q, _rotate(k, k_cos / k_scale, k_sin / k_scale)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """R x: each pair (x_i, x_{i + d/2}) of x (batch, heads, length, d_head) turned by its angle."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi's slope of each head: 2^(-8h/n) for h = 1..n when n is a power of two.

    Otherwise the slopes of the power of two below n, then every other slope
    of the power of two above it, as in the paper's code.
    """
    below = 2 ** math.floor(math.log2(n_heads))

    def geometric(n: int) -> Tensor:
        return 2.0 ** (-8.0 * torch.arange(1, n + 1, dtype=torch.float64) / n)

    extra = geometric(2 * below)[0::2][: n_heads - below]
    return torch.cat((geometric(below), extra)).float()


def alibi_bias(slopes: Tensor, distance: Tensor) -> Tensor:
    """(1, heads, queries, keys) bias -m_h |i - j| from the distances i - j (queries, keys)."""
    return -(slopes[:, None, None] * distance.abs().to(slopes.dtype))[None]


class AbsolutePositions(nn.Module):
    """Adds a position vector to each input vector: x + a PE[positions], a = `scale`."""

    def __init__(
        self,
        max_len: int,
        d_model: int,
        learned: bool,
        layout: str = "interleaved",
        scale: float = 1.0,
        interpolation: float = 1.0,
    ) -> None:
        super().__init__()
        self.max_len, self.scale = max_len, scale
        if learned:
            self.table = nn.Parameter(torch.empty(max_len, d_model).normal_(std=0.02))
        else:
            # A buffer, not a parameter: fixed, and not saved (it is a function of the shape).
            table = sinusoidal_table(max_len, d_model, layout, interpolation=interpolation)
            self.register_buffer("table", table, persistent=False)

    def vectors(self, length: int, positions: Tensor | None = None) -> Tensor:
        """a PE of positions (batch or 1, length), default 0..length-1: (batch or 1, length,
        d_model), or (length, d_model) for the default.

        The model checks lengths against max_len before it gets here.
        """
        rows = self.table[:length] if positions is None else self.table[positions]
        return rows if self.scale == 1.0 else rows * self.scale

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """x + a PE: x (batch, length, d_model), positions as `vectors` takes them."""
        return x + self.vectors(x.shape[1], positions)
