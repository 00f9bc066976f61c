"""The training-curves picture: losses, the learning rate beside them, and extra metrics."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from attnkit import viz

RECORDS = [
    {"step": 10, "train_loss": 3.0, "lr": 1e-3, "tokens_per_s": 500.0},
    {"step": 20, "train_loss": 2.5, "lr": 5e-4, "tokens_per_s": 510.0},
    {"step": 20, "val_loss": 2.6, "val_ppl": 13.5, "bleu": 4.0},
]


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> plt.Figure:
    """The figure `plot_curves` draws for RECORDS, kept open instead of closed after saving."""
    figures = []
    monkeypatch.setattr(plt, "close", lambda fig: figures.append(fig))
    path = viz.plot_curves(RECORDS, tmp_path / "curves.png")
    assert path.stat().st_size > 0
    yield figures[0]
    plt.close("all")


def _lines(ax: plt.Axes) -> dict[str, list[tuple[float, float]]]:
    return {line.get_label(): list(zip(*line.get_data(), strict=True)) for line in ax.get_lines()}


def test_losses_and_learning_rate_share_a_panel_and_metrics_get_their_own(drawn):
    loss, bleu, rate = drawn.axes  # the twin axis of the learning rate is added last
    assert _lines(loss) == {"train_loss": [(10, 3.0), (20, 2.5)], "val_loss": [(20, 2.6)]}
    assert _lines(rate) == {"lr": [(10, 1e-3), (20, 5e-4)]}
    assert rate.get_ylabel() == "learning rate"
    assert [t.get_text() for t in loss.get_legend().get_texts()] == ["train_loss", "val_loss", "lr"]
    assert _lines(bleu) == {"bleu": [(20, 4.0)]}
