"""T5's relative position bias (Raffel et al. 2020, section 2.1): a learned scalar per head
and bucket of relative distance, added to the attention scores.

    score(i, j) = q_i . k_j + b_h[bucket(j - i)]

Each layer of a stack adds the same biases (one table for the stack, shared by its
layers), and there are no position vectors at all. The buckets, for a relative
position r = j - i with B buckets and maximum distance D:

- an encoder looks both ways: half of the buckets are for keys after the query
  (r > 0), half for the others, so B' = B / 2 for each direction;
  a decoder looks back only: r > 0 does not occur, and B' = B over n = max(-r, 0);
- distances n < B' / 2 each have a bucket of their own (exact);
- farther ones share buckets spaced evenly in log n up to D, beyond which all
  fall in the last one:

    bucket(n) = B'/2 + floor( log(n / (B'/2)) / log(D / (B'/2)) * (B' - B'/2) ),
    capped at B' - 1.

The bucket of every distance a model can see (|r| < max_len) is computed once, in
float32 as T5's own code does (the floor must land where T5's lands), and kept; a
forward pass, or a decoding step over the cache, only looks up the rows it needs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def relative_buckets(
    relative_position: Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> Tensor:
    """The bucket (long) of each relative position j - i, by the rules of the module docstring."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    exact = num_buckets // 2
    # Where log(0) would be taken the exact branch is chosen; clamping keeps the other finite.
    spread = torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
    far = exact + (spread * (num_buckets - exact)).long()
    far = far.clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < exact, distance, far)


class RelativePositionBias(nn.Module):
    """The (num_buckets, heads) table of one stack and the bucket of every distance it sees.

    Called with distances i - j (queries, keys), as the stack and the KV cache count
    them, it returns the bias (1, heads, queries, keys).
    """

    def __init__(
        self,
        n_heads: int,
        num_buckets: int,
        max_distance: int,
        max_len: int,
        *,
        bidirectional: bool,
        init_std: float,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_buckets, n_heads).normal_(std=init_std))
        self.max_len = max_len
        # Bucket of the key-minus-query position r, held at r + max_len - 1.
        relative = torch.arange(-(max_len - 1), max_len)
        table = relative_buckets(relative, bidirectional, num_buckets, max_distance)
        self.register_buffer("buckets", table, persistent=False)

    def forward(self, distance: Tensor) -> Tensor:
        """distance (queries, keys), i - j -> bias (1, heads, queries, keys)."""
        buckets = self.buckets[self.max_len - 1 - distance]
        return self.weight[buckets].permute(2, 0, 1)[None]
