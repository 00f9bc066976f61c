"""Location-aware attention (Chorowski et al. 2015, "Attention-Based Models for Speech
Recognition", section 2.2): the previous alignment, convolved, joins the score.

Content-based attention finds where to look from what the source says, so two
similar source positions (a letter that occurs twice) look alike to it. The
paper's fix is to let the score also see where the last step looked: the previous
alignment alpha_{i-1} is convolved with learned filters F, and each position's
filter responses f_{i,j} enter the score through U and w:

    f_i = F * alpha_{i-1}
    e_{i,j} = w^T tanh(W s_{i-1} + V h_j + U f_{i,j} + b)
    alpha_i = softmax(e_i)

Here the content part is the Transformer's, per head, and the location part is
the paper's, per head: F and U are one convolution (both linear, so one
set of `location_filters` filters of width `location_kernel` per head), and

    e^h_{i,j} = q^h_i . k^h_j / sqrt(d_k) + w_h^T tanh(F_h * alpha^h_{i-1} + b_h)_j

w starts at zero, so the layer starts as plain attention and learns how much the
last alignment matters. The first step reads an alignment on the first source
token (the paper's alpha_0: the start). Alignments are made one target step
after another (`alignment_attention.py`), the same in training and decoding.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.nn.alignment_attention import AlignmentAttention, first_real


class LocationAwareAttention(AlignmentAttention):
    """Cross-attention whose score adds a convolution of the previous alignment, per head."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        filters: int = 32,
        kernel: int = 31,
        **options,
    ) -> None:
        super().__init__(d_model, n_heads, n_kv_heads, **options)
        self.filters = filters
        # F and b of every head at once: each head's channel convolved by its own filters.
        self.location_conv = nn.Conv1d(
            n_heads, n_heads * filters, kernel, padding=kernel // 2, groups=n_heads
        )
        self.location_weight = nn.Parameter(torch.zeros(n_heads, filters))  # w_h

    def location(self, previous: Tensor) -> Tensor:
        """w_h^T tanh(F_h * alpha^h_{i-1} + b_h) (batch, heads, source) of the previous
        alignment (batch, heads, source)."""
        f = self.location_conv(previous).unflatten(1, (self.n_heads, self.filters))
        return torch.einsum("bhfs,hf->bhs", f.tanh(), self.location_weight)

    def initial_state(self, real: Tensor, decoding: bool) -> Tensor:
        return first_real(real, self.n_heads, self.q_proj.weight.dtype)

    def align(
        self, x: Tensor, q: Tensor, k: Tensor, real: Tensor, state: Tensor, decoding: bool
    ) -> tuple[Tensor, Tensor]:
        scores = self.scores(q, k, real)
        alignments = []
        previous = state
        for i in range(q.shape[2]):
            previous = (scores[:, :, i] + self.location(previous)).softmax(-1)
            alignments.append(previous)
        return torch.stack(alignments, 2), previous
