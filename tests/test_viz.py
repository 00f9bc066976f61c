"""Pictures: the training curves (losses, learning rate, metrics) and cross-attention maps."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from attnkit import viz
from attnkit.errors import AttnkitError
from tests.helpers import tiny_model

RECORDS = [
    {"step": 10, "train_loss": 3.0, "lr": 1e-3, "tokens_per_s": 500.0},
    {"step": 20, "train_loss": 2.5, "lr": 5e-4, "tokens_per_s": 510.0},
    {"step": 20, "val_loss": 2.6, "val_ppl": 13.5, "bleu": 4.0},
]


@pytest.fixture
def kept(monkeypatch: pytest.MonkeyPatch) -> list[plt.Figure]:
    """The figures the pictures draw, kept open instead of closed after saving."""
    figures: list[plt.Figure] = []
    monkeypatch.setattr(plt, "close", lambda fig: figures.append(fig))
    yield figures
    plt.close("all")


@pytest.fixture
def drawn(kept: list[plt.Figure], tmp_path: Path) -> plt.Figure:
    """The figure `plot_curves` draws for RECORDS."""
    path = viz.plot_curves(RECORDS, tmp_path / "curves.png")
    assert path.stat().st_size > 0
    return kept[0]


def _lines(ax: plt.Axes) -> dict[str, list[tuple[float, float]]]:
    return {line.get_label(): list(zip(*line.get_data(), strict=True)) for line in ax.get_lines()}


def test_losses_and_learning_rate_share_a_panel_and_metrics_get_their_own(drawn):
    loss, bleu, rate = drawn.axes  # the twin axis of the learning rate is added last
    assert _lines(loss) == {"train_loss": [(10, 3.0), (20, 2.5)], "val_loss": [(20, 2.6)]}
    assert _lines(rate) == {"lr": [(10, 1e-3), (20, 5e-4)]}
    assert rate.get_ylabel() == "learning rate"
    assert [t.get_text() for t in loss.get_legend().get_texts()] == ["train_loss", "val_loss", "lr"]
    assert _lines(bleu) == {"bleu": [(20, 4.0)]}


@pytest.mark.parametrize("last_layer_heads", [True, False])
def test_cross_attention_shows_each_decoder_layer_then_the_last_layer_s_heads(
    kept, tmp_path, last_layer_heads
):
    model = tiny_model(layers=2)
    src, tgt = [5, 6, 7], [1, 8, 9, 10]
    path = viz.plot_cross_attention(
        model, src, tgt, tmp_path / "cross.png", token=str, last_layer_heads=last_layer_heads
    )
    assert path.stat().st_size > 0
    panels = [ax for ax in kept[0].axes if ax.get_title()]
    titles = [ax.get_title() for ax in panels]
    heads = ["decoder layer 2, head 1", "decoder layer 2, head 2"] if last_layer_heads else []
    assert titles == ["decoder layer 1, mean of heads", "decoder layer 2, mean of heads", *heads]
    first = panels[0]
    assert [t.get_text() for t in first.get_xticklabels()] == ["5", "6", "7"]
    assert [t.get_text() for t in first.get_yticklabels()] == ["1", "8", "9", "10"]
    assert first.get_images()[0].get_array().shape == (len(tgt), len(src))


@pytest.mark.parametrize(("shape", "kind"), [
    ("encoder-decoder", "encoder"), ("encoder-decoder", "decoder"), ("decoder", "decoder"),
    ("encoder", "encoder"),
])  # fmt: skip
def test_self_attention_is_drawn_on_its_own_tokens(kept, tmp_path, shape, kind):
    model = tiny_model(shape, layers=1)
    src, tgt = [5, 6, 7], [1, 8, 9, 10]
    viz.plot_model_attention(
        model, src, tmp_path / "self.png", kind=kind, token=str,
        tgt=tgt if shape == "encoder-decoder" else None,
    )  # fmt: skip
    first = next(ax for ax in kept[0].axes if ax.get_title())
    own = tgt if kind == "decoder" and shape == "encoder-decoder" else src
    assert first.get_title() == f"{kind} layer 1, mean of heads"
    assert [t.get_text() for t in first.get_xticklabels()] == [str(i) for i in own]
    assert first.get_images()[0].get_array().shape == (len(own), len(own))


def test_an_attention_the_model_lacks_is_named(tmp_path):
    with pytest.raises(AttnkitError, match="has no cross attention; it has decoder"):
        viz.plot_model_attention(
            tiny_model("decoder"), [5, 6], tmp_path / "x.png", kind="cross", token=str
        )


def test_each_positional_method_draws_its_own_picture(tmp_path):
    """The picture follows the model: its learned table, RoPE's or xPos's turning pairs and
    scores, ALiBi's slopes, or a sentence for none; each method's differs from the others."""
    drawn = {}
    for kind in ("sinusoidal", "learned", "rope", "xpos", "alibi", "none"):
        model = tiny_model("decoder", positional=kind, xpos_scale_base=8.0, max_len=48)
        path = viz.plot_model_positions(model, tmp_path / f"{kind}.png")
        drawn[kind] = path.read_bytes()
    assert all(png.startswith(b"\x89PNG") for png in drawn.values())
    assert len(set(drawn.values())) == 6
