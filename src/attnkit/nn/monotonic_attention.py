"""Monotonic attention (Raffel et al. 2017, "Online and Linear-Time Attention by Enforcing
Monotonic Alignments"), and MoChA (Chiu and Raffel 2018, "Monotonic Chunkwise Attention").

Hard monotonic attention reads the source once, left to right. At output step i
each head starts where it stopped at step i - 1, t_{i-1}, and moves on: at each
source position j >= t_{i-1} it stops with probability

    p_{i,j} = sigmoid(e_{i,j}),     e_{i,j} = q_i . k_j / sqrt(d_k) + r

and attends to the position where it stops, t_i = j; if it passes the end, it
attends to nothing (a zero context) from then on. When decoding, a head stops at
the first j >= t_{i-1} with p_{i,j} > 1/2, so it never moves left, and the
whole output reads the source in one pass.

Stopping is not differentiable, so training uses its expectation: the
probability that step i stops at j, given where step i - 1 stopped (eq. 9),

    alpha_{i,j} = p_{i,j} sum_{k<=j} alpha_{i-1,k} prod_{l=k}^{j-1} (1 - p_{i,l})

with alpha_0 on the first source token. sum_j alpha_{i,j} <= 1: what is missing is
the chance that the head passed the end. The products are computed as
exp(L_j - L_k) with L_j = sum_{l<j} log(1 - p_{i,l}) (log(1 - p) = -softplus(e)):
for k <= j the exponent is <= 0, so no term overflows, however close p comes to
1 (the paper's own parallel form divides by a cumulative product, which can
underflow to zero). That costs O(source^2) per step, fine for words and sentences.

Noise of standard deviation `noise` is added to e in training, which pushes the
p's towards 0 and 1, where the expectation and the hard decision agree; r (per
head, `monotonic_bias`) starts negative so that attention first moves on rather
than stopping at once.

MoChA widens the stop into a chunk: with the stop at j, soft attention over the
w positions j - w + 1 .. j, on energies u_{i,k} of their own (here a second
query projection, the keys shared). In training, the expectation of that (eq. 5
of MoChA):

    beta_{i,k} = sum_{j=k}^{k+w-1} alpha_{i,j} exp(u_{i,k}) / sum_{l=j-w+1}^{j} exp(u_{i,l})
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.nn.alignment_attention import AlignmentAttention, first_real
from attnkit.nn.linear import Linear


class MonotonicAttention(AlignmentAttention):
    """Hard monotonic attention (chunk 1) or MoChA (chunk w > 1), per head.

    The decoding state is each head's stop t (batch, heads), the source length once
    it has passed the end; the training state is the expected alignment alpha.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        chunk: int = 1,
        noise: float = 1.0,
        energy_bias: float = -1.0,
        bias: bool = True,
        **options,
    ) -> None:
        super().__init__(d_model, n_heads, n_kv_heads, bias=bias, **options)
        self.chunk, self.noise = chunk, noise
        self.energy_bias = nn.Parameter(torch.full((n_heads,), float(energy_bias)))  # r
        self.chunk_q_proj = Linear(d_model, n_heads * self.d_head, bias=bias) if chunk > 1 else None

    def initial_state(self, real: Tensor, decoding: bool) -> Tensor:
        if decoding:
            return real.long().argmax(-1)[:, None].expand(-1, self.n_heads).clone()
        return first_real(real, self.n_heads, self.q_proj.weight.dtype)

    def energies(self, q: Tensor, k: Tensor, real: Tensor) -> Tensor:
        """e = q . k / sqrt(d_k) + r (batch, heads, queries, source), -inf over padding."""
        return self.scores(q, k, real) + self.energy_bias[:, None, None]

    def align(
        self, x: Tensor, q: Tensor, k: Tensor, real: Tensor, state: Tensor, decoding: bool
    ) -> tuple[Tensor, Tensor]:
        e = self.energies(q, k, real)
        u = None
        if self.chunk_q_proj is not None:
            u = self.scores(self.scaled(self._heads(self.chunk_q_proj(x), self.n_heads)), k, real)
        if decoding:
            return self._hard(e, u, real, state)
        if self.training and self.noise:
            e = e + self.noise * torch.randn_like(e)
        alpha = expected_alignment(e, state)
        return (alpha if u is None else chunk_expectation(alpha, u, self.chunk)), alpha[:, :, -1]

    def _hard(
        self, e: Tensor, u: Tensor | None, real: Tensor, stop: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Each query in turn: stop at the first j >= t with p > 1/2 (e > 0), or pass the end."""
        source = e.shape[-1]
        position = torch.arange(source, device=e.device)
        weights = []
        for i in range(e.shape[2]):
            stops = (position >= stop[..., None]) & (e[:, :, i] > 0)
            found = stops.any(-1)
            stop = torch.where(found, stops.long().argmax(-1), source)
            if u is None:
                # One past the end is a column that is cut off: a zero alignment.
                chosen = F.one_hot(stop, source + 1)[..., :source]
                weights.append(chosen.to(e.dtype))
                continue
            window = (position <= stop[..., None]) & (position > stop[..., None] - self.chunk)
            scores = u[:, :, i].masked_fill(~(window & real[:, None]), float("-inf"))
            soft = scores.masked_fill(~found[..., None], 0.0).softmax(-1)
            weights.append(soft * found[..., None])
        return torch.stack(weights, 2), stop


def expected_alignment(e: Tensor, previous: Tensor) -> Tensor:
    """alpha (batch, heads, queries, source) of eq. 9 from energies e (-inf where no stop may
    happen) and the alignment before the first query, previous (batch, heads, source)."""
    p = torch.sigmoid(e)
    log_pass = -F.softplus(e)  # log(1 - p)
    before = log_pass.cumsum(-1) - log_pass  # L_j = sum_{l<j} log(1 - p_l)
    source = e.shape[-1]
    later = torch.ones(source, source, dtype=torch.bool, device=e.device).triu()  # k <= j
    alphas = []
    for i in range(e.shape[2]):
        exponent = before[:, :, i, None, :] - before[:, :, i, :, None]  # [k, j]: L_j - L_k
        carried = torch.where(later, exponent, float("-inf")).exp()
        previous = p[:, :, i] * (previous[..., None, :] @ carried).squeeze(-2)
        alphas.append(previous)
    return torch.stack(alphas, 2)


def chunk_expectation(alpha: Tensor, u: Tensor, w: int) -> Tensor:
    """MoChA's beta (batch, heads, queries, source) from alpha and the chunk energies u
    (-inf over padding), for chunks of w positions."""
    # exp(u) shifted by each row's largest real energy (the ratios are unchanged).
    top = u.amax(-1, keepdim=True).clamp(min=-1e4)
    scaled = (u - top).exp()
    # sum_{l=j-w+1}^{j} exp(u_l) for every j: windows ending at j, zeros before the start.
    ending = F.pad(scaled, (w - 1, 0)).unfold(-1, w, 1).sum(-1)
    ratio = alpha / ending.clamp(min=torch.finfo(u.dtype).tiny)
    # sum_{j=k}^{k+w-1} alpha_j / ending_j for every k: windows starting at k.
    starting = F.pad(ratio, (0, w - 1)).unfold(-1, w, 1).sum(-1)
    return scaled * starting
