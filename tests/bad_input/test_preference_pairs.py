"""DPO's pairs are checked, not inferred (issue 53, BAD 6): a hand-built batch of 3 rows was read
as one pair and a stray row (loss 1.386, a chosen row scored as rejected), and
`preference_batch` truncated float and bool ids. A batch must hold n chosen rows, then the n
rejected rows of the same prompts; ids must be ints."""

from __future__ import annotations

import pytest
import torch

from attnkit import AttnkitError
from attnkit.data.preference import PreferenceBatch, preference_batch
from attnkit.train.preference import DPO
from tests.helpers import tiny_model

PAIRS = [([5, 6], [7, 8], [9]), ([5, 9, 9], [6], [7, 7])]


@pytest.mark.parametrize("start", [None, 1], ids=["decoder", "encoder-decoder"])
def test_an_odd_number_of_rows_is_refused(start) -> None:
    batch = preference_batch(PAIRS, 0, start)
    cut = dict(tgt=batch.tgt[:3], tgt_mask=batch.tgt_mask[:3], scored=batch.scored[:3])
    if start is not None:
        cut.update(src=batch.src[:3], src_mask=batch.src_mask[:3])
    with pytest.raises(AttnkitError, match="so an even number of rows, not 3"):
        PreferenceBatch(**cut)


@pytest.mark.parametrize("start", [None, 1], ids=["decoder", "encoder-decoder"])
def test_rows_of_other_prompts_are_no_pair(start) -> None:
    batch = preference_batch(PAIRS, 0, start)
    order = torch.tensor([0, 1, 3, 2])  # the rejected rows swapped: prompts no longer match
    rows = {k: getattr(batch, k)[order] for k in ("tgt", "tgt_mask", "scored")}
    if start is not None:
        rows.update(src=batch.src[order], src_mask=batch.src_mask[order])
    with pytest.raises(AttnkitError, match="rows 0 and 2 of this preference batch are no pair"):
        PreferenceBatch(**rows)


def test_dpo_never_sees_a_hand_built_batch_of_three_rows() -> None:
    model = tiny_model("decoder")
    tgt = torch.tensor([[5, 6, 7], [5, 6, 8], [5, 6, 9]])
    scored = torch.tensor([[False, False, True]] * 3)
    with pytest.raises(AttnkitError, match="even number of rows"):
        DPO(model)(model, PreferenceBatch(tgt=tgt, tgt_mask=torch.ones_like(scored), scored=scored))


@pytest.mark.parametrize(
    ("pair", "said"),
    [
        (([5, 6.7], [7], [8]), r"pair 0's prompt\[1\] is 6\.7, not a token id"),
        (([5, 6], [True], [8]), r"pair 0's chosen\[0\] is True, not a token id"),
        (([5, 6], [7], [8.0]), r"pair 0's rejected\[0\] is 8\.0, not a token id"),
        (([5], [7]), "pair 0 has 2 parts, not"),
    ],
)
def test_preference_batch_refuses_ids_that_are_not_ints(pair, said) -> None:
    with pytest.raises(AttnkitError, match=said):
        preference_batch([pair], 0)


def test_a_well_made_batch_still_pairs() -> None:
    batch = preference_batch([(torch.tensor([5, 6]), (7, 8), [9])], 0)
    assert batch.pairs == 1 and batch.tgt.tolist() == [[5, 6, 7, 8], [5, 6, 9, 0]]
