"""The output distribution against the one-hot target: p_t read from the model's logits, the
cross-entropy it gives, the picture's bars, and training moving the mass onto the targets."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import torch

from attnkit.errors import AttnkitError
from attnkit.output_distribution import plot_output_distribution, target_distributions
from attnkit.run import load_run
from tests.helpers import tiny_run

TEXT = "a dog runs"


@pytest.fixture
def kept(monkeypatch: pytest.MonkeyPatch) -> list[plt.Figure]:
    figures: list[plt.Figure] = []
    monkeypatch.setattr(plt, "close", lambda fig: figures.append(fig))
    yield figures
    plt.close("all")


def test_a_language_models_distributions_are_its_softmax_at_each_next_token(
    tmp_path: Path,
) -> None:
    run = load_run(tiny_run(tmp_path / "lm", "decoder"))
    got = target_distributions(run.model, run.tokenizer, TEXT)
    ids = run.tokenizer.encode(TEXT)
    logits = run.model(torch.tensor([ids[:-1]])).logits[0].detach().double()
    for t, target in enumerate(ids[1:]):
        by_hand = [math.exp(v) for v in logits[t].tolist()]
        total = sum(by_hand)
        assert got.probs[t].double().tolist() == pytest.approx([v / total for v in by_hand])
        assert float(got.losses[t]) == pytest.approx(-math.log(by_hand[target] / total), rel=1e-5)
    assert got.targets.tolist() == ids[1:] and got.tokens == list(TEXT[1:])
    # the mean of the losses is the model's cross-entropy on the sentence
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]))
    assert float(got.losses.mean()) == pytest.approx(float(loss), rel=1e-5)


def test_a_translation_model_predicts_the_target_and_its_end_from_start(tmp_path: Path) -> None:
    run = load_run(tiny_run(tmp_path / "mt", "encoder-decoder"))
    got = target_distributions(run.model, run.tokenizer, "a dog", source="ein hund")
    tgt = run.tokenizer.encode("a dog", add_bos=True, add_eos=True)
    src = run.tokenizer.encode("ein hund", add_eos=True)
    logits = run.model(torch.tensor([src]), torch.tensor([tgt[:-1]])).logits[0]
    torch.testing.assert_close(got.probs, logits.softmax(-1))
    assert got.targets.tolist() == tgt[1:] and got.targets[-1] == run.tokenizer.eos_id


def test_training_moves_the_mass_onto_the_targets(tmp_path: Path) -> None:
    run = load_run(tiny_run(tmp_path / "lm", "decoder"))
    model, ids = run.model, torch.tensor([run.tokenizer.encode(TEXT)])
    before = target_distributions(model, run.tokenizer, TEXT)
    # an untrained model spreads p_t nearly evenly: -log p(target) near log V
    assert abs(float(before.losses.mean()) - math.log(model.config.vocab_size)) < 1.0
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(60):
        logits = model(ids[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits[0], ids[0, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = target_distributions(model, run.tokenizer, TEXT)
    assert float(after.target_probs.min()) > 0.8
    assert float(after.losses.mean()) < 0.2 < float(before.losses.mean())


def test_the_picture_draws_the_probabilities_it_is_given(
    tmp_path: Path, kept: list[plt.Figure]
) -> None:
    run = load_run(tiny_run(tmp_path / "lm", "decoder"))
    got = target_distributions(run.model, run.tokenizer, TEXT)
    flat = torch.full_like(got.probs, 1 / got.probs.shape[1])
    sides = [("before", flat), ("after", got.probs)]
    plot_output_distribution(sides, got.targets, got.tokens, tmp_path / "d.png", top=4)
    axes = kept[0].axes
    assert len(axes) == 2 * len(got.targets)
    for row, (_, probs) in enumerate(sides):
        for t in range(len(got.targets)):
            ax = axes[row * len(got.targets) + t]
            bars = [patch.get_height() for patch in ax.patches]
            *drawn, one_hot = bars
            assert one_hot == 1.0 and len(drawn) == 4
            assert drawn[0] == pytest.approx(float(probs[t, got.targets[t]]))
            others = probs[t].clone()
            others[got.targets[t]] = -1
            assert drawn[1:] == pytest.approx(others.sort(descending=True).values[:3].tolist())
            assert f"p = {float(probs[t, got.targets[t]]):.3f}" in ax.get_title()


def test_an_encoder_a_missing_source_and_a_one_token_text_are_refused(tmp_path: Path) -> None:
    lm = load_run(tiny_run(tmp_path / "lm", "decoder"))
    mt = load_run(tiny_run(tmp_path / "mt", "encoder-decoder"))
    with pytest.raises(AttnkitError, match="source"):
        target_distributions(mt.model, mt.tokenizer, "a dog")
    with pytest.raises(AttnkitError, match="no source"):
        target_distributions(lm.model, lm.tokenizer, "a dog", source="ein hund")
    with pytest.raises(AttnkitError, match="at least two"):
        target_distributions(lm.model, lm.tokenizer, "a")
