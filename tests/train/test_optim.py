import itertools

import pytest
import torch

from attnkit.train.optim import (
    TimeBudget,
    build_optimizer,
    build_scheduler,
    no_decay_names,
    paper_rate,
    parameter_groups,
    schedule_factor,
)
from tests.helpers import tiny_model


def expected_no_decay(model) -> set[str]:
    """Biases, norm parameters and embedding tables, by name."""
    return {
        name
        for name, _ in model.named_parameters()
        if name.endswith(".bias")
        or ".norm." in name
        or name.endswith("token.weight")
        or name.endswith("positions.table")
    }


@pytest.mark.parametrize(
    ("shape", "changes"),
    [
        ("encoder-decoder", {}),
        ("encoder-decoder", {"tie_embeddings": "none", "norm_position": "pre"}),
        ("decoder", {"positional": "learned"}),
        ("encoder", {"tie_embeddings": "none"}),
    ],
)
def test_no_decay_groups_hold_exactly_biases_norms_and_embeddings(shape, changes):
    model = tiny_model(shape, **changes)
    names = no_decay_names(model)
    assert names == expected_no_decay(model)
    assert any(n.endswith(".bias") for n in names) and any("norm" in n for n in names)
    assert any(n.endswith("token.weight") for n in names)
    decayed, exempt = parameter_groups(model, 0.1)
    assert decayed["weight_decay"] == 0.1 and exempt["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decayed["params"])
    assert len(decayed["params"]) + len(exempt["params"]) == len(list(model.parameters()))


def test_embeddings_are_decayed_when_asked_as_nanogpt_decays_every_matrix():
    model = tiny_model("decoder", positional="learned")
    names = no_decay_names(model, decay_embeddings=True)
    assert names == expected_no_decay(model) - {"embed.token.weight", "embed.positions.table"}
    decayed, _ = parameter_groups(model, 0.1, decay_embeddings=True)
    # Every matrix, as nanoGPT's groups (p.dim() >= 2), the tied token table counted once.
    matrices = {id(p) for p in model.parameters() if p.dim() >= 2}
    assert {id(p) for p in decayed["params"]} == matrices


def test_untied_output_projection_is_decayed():
    model = tiny_model(tie_embeddings="none")
    assert "head.weight" not in no_decay_names(model)
    assert {"src_embed.token.weight", "tgt_embed.token.weight"} <= no_decay_names(model)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("d_model", "warmup"), [(512, 4000), (256, 1000)])
def test_warmup_schedule_is_the_papers_formula(d_model, warmup):
    model = torch.nn.Linear(2, 2)
    peak = (d_model * warmup) ** -0.5
    optimizer = build_optimizer(model, lr=peak)
    factor = schedule_factor("inverse-sqrt", lr=peak, warmup=warmup, steps=100_000)
    scheduler = build_scheduler(optimizer, factor)
    checkpoints = {1, 2, 100, warmup - 1, warmup, warmup + 1, 3 * warmup, 50_000}
    for step in range(1, 50_001):
        # The k-th update runs at the rate the optimizer holds before it.
        if step in checkpoints:
            lr = optimizer.param_groups[0]["lr"]
            paper = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
            assert lr == pytest.approx(paper, rel=1e-12), step
            assert paper_rate(step, d_model, warmup) == pytest.approx(paper, rel=1e-15)
        scheduler.step()


def test_cosine_schedule_warms_up_then_decays_to_min_lr():
    f = schedule_factor("cosine", lr=1e-3, warmup=10, steps=110, min_lr=1e-4)
    assert f(1) == pytest.approx(0.1) and f(10) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.1 + 0.9 * 0.5)
    assert f(110) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)
    values = [f(s) for s in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(values))


def test_linear_and_constant_schedules():
    linear = schedule_factor("linear", lr=1.0, warmup=4, steps=8)
    assert [linear(s) for s in range(1, 9)] == pytest.approx(
        [0.25, 0.5, 0.75, 1, 0.75, 0.5, 0.25, 0]
    )
    constant = schedule_factor("constant", lr=1.0, warmup=0, steps=8)
    assert constant(1) == constant(100) == 1.0


def test_time_budget_ends_a_linear_decay_when_the_time_runs_out():
    # 2 s per step and a 100 s budget: 50 steps fit, though `steps` would allow 1,000.
    budget = TimeBudget(100.0, 1000)
    f = schedule_factor("linear", lr=1.0, warmup=0, steps=1000)
    budget.begin(0)
    assert budget.last_step(1) == 1000  # no step observed yet: the decay follows the steps
    rates = []
    for step in range(1, 51):
        rates.append(f(step, budget.last_step(step)))
        budget.observe(step, 2.0 * step)
    # From the second step on, the rate is 1 - (the budget spent after this step).
    assert rates[0] == pytest.approx(1 - 1 / 1000)
    assert rates[1:] == pytest.approx([1 - step / 50 for step in range(2, 51)])
    assert f(50) == pytest.approx(1 - 50 / 1000)  # decaying over steps, it would barely move


def test_time_budget_after_a_slow_start_and_on_resume():
    # Warmup of 5, a 20 s first step then 2 s per step: the budget of 100 s ends after 41 steps.
    budget = TimeBudget(100.0, 10_000)
    f = schedule_factor("cosine", lr=1e-3, warmup=5, steps=10_000, min_lr=1e-4)
    budget.begin(0)
    rates = []
    for step in range(1, 43):
        rates.append(f(step, budget.last_step(step)))
        budget.observe(step, 20.0 + 2.0 * (step - 1))
    assert rates[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert all(a >= b for a, b in itertools.pairwise(rates[4:]))
    assert rates[30] > 0.2  # still well above the floor with a quarter of the time left
    assert rates[-1] == pytest.approx(0.1)  # the step after the budget ran out: the floor

    # A session resumed after step 300 measures its own pace: 1 s per step, 100 s, so the
    # decay ends at step 400.
    budget.begin(300)
    assert budget.last_step(301) == 10_000  # the last session's pace is not carried over
    for step in range(301, 311):
        last = budget.last_step(step)
        budget.observe(step, 1.0 * (step - 300))
    assert last == pytest.approx(400)


def test_time_budget_never_raises_the_rate_when_the_pace_quickens():
    # Three slow steps (a loaded machine), then fast ones: the raw estimate of the end moves
    # much later, but the decay's fraction done never goes back.
    budget = TimeBudget(60.0, 10_000)
    f = schedule_factor("linear", lr=1.0, warmup=0, steps=10_000)
    budget.begin(0)
    rates, now = [], 0.0
    for step in range(1, 200):
        rates.append(f(step, budget.last_step(step)))
        now += 5.0 if step <= 3 else 0.1
        budget.observe(step, now)
    assert all(a >= b for a, b in itertools.pairwise(rates))
    assert rates[-1] < 0.5  # and it still decays: 199 steps of the 60 s budget's ~460
