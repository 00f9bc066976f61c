"""T5's span corruption: 15% of tokens in spans of mean length 3, each span a sentinel in the
input and the sentinel with the span in the target, so input and target rebuild the text."""

import pytest
import torch

from attnkit import AttnkitError
from attnkit.data.span_corruption import noise_mask, span_corruption

SENTINELS = list(range(1000, 1100))


def rebuild(inputs, targets):
    """The original ids: each input sentinel replaced by what follows it in the target."""
    spans, current = {}, None
    for token in targets:
        if token in SENTINELS:
            current = token
            spans[current] = []
        else:
            spans[current].append(token)
    out = []
    for token in inputs:
        out += spans[token] if token in SENTINELS else [token]
    return out


def test_input_and_target_rebuild_the_sequence():
    g = torch.Generator().manual_seed(0)
    for n in (2, 5, 20, 113):
        ids = list(range(10, 10 + n))
        inputs, targets = span_corruption(ids, SENTINELS, g)
        assert rebuild(inputs, targets) == ids
        assert targets[0] == SENTINELS[0] and targets[-1] in SENTINELS  # opened and closed
        used = [t for t in inputs if t in SENTINELS]
        assert used == SENTINELS[: len(used)]  # in order, one a span


def test_fifteen_percent_in_spans_of_mean_length_three():
    g = torch.Generator().manual_seed(1)
    dropped, spans = 0, 0
    for _ in range(200):
        mask = noise_mask(100, 0.15, 3.0, g)
        assert sum(mask) == 15
        dropped += sum(mask)
        spans += sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))
    assert dropped / spans == pytest.approx(3.0)  # round(15 / 3) = 5 spans each time


def test_the_split_is_random_but_seeded():
    def draw(seed):
        return noise_mask(60, 0.15, 3.0, torch.Generator().manual_seed(seed))

    assert draw(3) == draw(3) and draw(3) != draw(4)


def test_too_few_sentinels_or_tokens_are_refused_in_one_sentence():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(AttnkitError, match="more spans than the 2 sentinels"):
        span_corruption(list(range(200)), [1000, 1001], g)
    with pytest.raises(AttnkitError, match="at least 2 tokens"):
        span_corruption([5], SENTINELS, g)
