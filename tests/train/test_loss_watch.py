"""The loss watched on the device: the first bad step found, and no update from it on."""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import AttnkitError
from attnkit.train.loss_watch import LossWatch

LOSSES = [2.0, 1.5, float("nan"), 1.0, float("inf")]


def test_the_first_non_finite_step_is_kept_and_reported(tmp_path):
    watch = LossWatch(torch.device("cpu"), every=5)
    skips = [
        float(watch.step(s, torch.tensor(v), torch.tensor(10.0))) for s, v in enumerate(LOSSES, 1)
    ]
    assert skips == [0.0, 0.0, 1.0, 1.0, 1.0]  # from the first bad step on, nothing updates
    assert watch.due(5) and not watch.due(4)
    with pytest.raises(AttnkitError, match=r"^the training loss became nan at step 3") as err:
        watch.check(tmp_path, saved_step=2)
    assert "the last checkpoint in" in str(err.value) and "of step 2, is intact" in str(err.value)


def test_a_step_without_target_tokens_is_reported(tmp_path):
    watch = LossWatch(torch.device("cpu"), every=1)
    watch.step(1, torch.tensor(3.0), torch.tensor(4.0))
    watch.check(tmp_path, None)  # nothing wrong yet
    assert float(watch.step(2, torch.tensor(0.0), torch.tensor(0.0))) == 1.0
    with pytest.raises(AttnkitError, match="the training batch of step 2 has no target tokens"):
        watch.check(tmp_path, None)


def test_the_fused_adamw_leaves_the_weights_as_they_were_from_the_bad_step_on():
    weight = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.AdamW([weight], lr=0.1, fused=True)
    watch = LossWatch(torch.device("cpu"), every=5)
    seen = []
    for step, value in enumerate(LOSSES, 1):
        weight.grad = torch.full((4,), value if step != 4 else 1.0)
        optimizer.found_inf = watch.step(step, torch.tensor(value), torch.tensor(1.0))
        optimizer.step()
        seen.append(weight.detach().clone())
    assert not torch.equal(seen[0], seen[1])  # good steps update
    assert all(torch.equal(w, seen[1]) for w in seen[2:])  # the finite step 4 too is held
    assert torch.isfinite(weight).all()
