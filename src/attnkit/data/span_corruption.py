"""T5's span corruption (Raffel et al. 2020, section 3.1.4 and 3.3.4): the pre-training
objective that drops spans of the input and asks the decoder for them.

Of a sequence of n tokens, round(n * noise_density) are dropped (15% in T5), in
round(dropped / mean_span_length) spans (mean length 3); the span lengths are a
random split of the dropped count, and of the kept count, into that many parts
each, the spans interleaved kept-first. Each dropped span becomes one sentinel in
the input; the target is every sentinel followed by the span it replaced:

    Thank you for inviting me to your party last week .
    input:   Thank you <X> me to your party <Y> week .
    target:  <X> for inviting <Y> last <Z>

(with a final sentinel <Z> that closes the last span). Sentinels are ids the
vocabulary sets apart (T5's <extra_id_0>, <extra_id_1>, ...), given in order.
The split is as T5's `random_spans_noise_mask`: every span has at least one
token, and at least one token is dropped and one kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import torch

from attnkit.errors import AttnkitError


def _random_split(total: int, parts: int, generator: torch.Generator) -> list[int]:
    """`total` split into `parts` positive lengths at random (a random composition)."""
    cuts = torch.randperm(total - 1, generator=generator)[: parts - 1].add(1).sort().values
    edges = [0, *cuts.tolist(), total]
    return [b - a for a, b in pairwise(edges)]


def noise_mask(
    length: int, noise_density: float, mean_span_length: float, generator: torch.Generator
) -> list[bool]:
    """Which of `length` tokens are dropped (True), in spans as the module docstring says."""
    dropped = min(max(round(length * noise_density), 1), length - 1)
    spans = max(round(dropped / mean_span_length), 1)
    spans = min(spans, dropped, length - dropped)
    noise = _random_split(dropped, spans, generator)
    kept = _random_split(length - dropped, spans, generator)
    mask: list[bool] = []
    for keep, drop in zip(kept, noise, strict=True):
        mask += [False] * keep + [True] * drop
    return mask


def span_corruption(
    ids: Sequence[int],
    sentinels: Sequence[int],
    generator: torch.Generator,
    noise_density: float = 0.15,
    mean_span_length: float = 3.0,
) -> tuple[list[int], list[int]]:
    """The input (spans replaced by sentinels) and the target (sentinel, span, ..., sentinel)
    of one sequence of ids."""
    if len(ids) < 2:
        raise AttnkitError(f"span corruption needs at least 2 tokens, got {len(ids)}")
    if not 0 < noise_density < 1 or mean_span_length < 1:
        raise AttnkitError(
            f"span corruption needs 0 < noise_density < 1 and mean_span_length >= 1, got "
            f"{noise_density} and {mean_span_length}"
        )
    mask = noise_mask(len(ids), noise_density, mean_span_length, generator)
    inputs: list[int] = []
    targets: list[int] = []
    used = 0
    for i, (token, dropped) in enumerate(zip(ids, mask, strict=True)):
        starts = dropped and (i == 0 or not mask[i - 1])
        if starts:
            if used == len(sentinels):
                raise AttnkitError(
                    f"this sequence of {len(ids)} tokens has more spans than the "
                    f"{len(sentinels)} sentinels; give more sentinel ids or shorter sequences"
                )
            inputs.append(sentinels[used])
            targets.append(sentinels[used])
            used += 1
        (targets if dropped else inputs).append(token)
    if used == len(sentinels):
        raise AttnkitError(
            f"the closing sentinel needs one more than the {len(sentinels)} sentinel ids"
        )
    targets.append(sentinels[used])
    return inputs, targets
