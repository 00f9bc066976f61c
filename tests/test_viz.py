"""Pictures, read back from the figures they draw: the training curves (losses, learning rate,
metrics), attention maps, word vectors as colour strips and the positional encoding."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import torch

from attnkit import viz
from attnkit.embeddings.vectors import WordVectors
from attnkit.errors import AttnkitError
from attnkit.nn import sinusoidal_table
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


def test_colour_strips_are_the_vectors_themselves_one_row_a_word(kept, tmp_path):
    torch.manual_seed(0)
    words = ["king", "man", "woman", "queen", "cat"]
    vectors = WordVectors(words, torch.randn(5, 12))
    shown = ["king", "man", "woman", "queen"]
    viz.plot_vector_strips(vectors, shown, tmp_path / "strips.png")
    ax = kept[0].axes[0]
    image = ax.get_images()[0]
    expected = torch.stack([vectors[w] for w in shown]).double().numpy()
    assert image.get_array().shape == (4, 12)
    assert (image.get_array() == expected).all()
    assert [t.get_text() for t in ax.get_yticklabels()] == shown
    # one colour scale for every row, symmetric about 0 so that 0 is white
    bound = abs(expected).max()
    assert image.get_clim() == (-bound, bound)


def test_colour_strips_can_show_the_first_dimensions_only(kept, tmp_path):
    vectors = WordVectors(["a", "b"], torch.arange(20.0).view(2, 10))
    viz.plot_vector_strips(vectors, ["b"], tmp_path / "strips.png", dims=4)
    assert (kept[0].axes[0].get_images()[0].get_array() == [[10, 11, 12, 13]]).all()
    with pytest.raises(AttnkitError, match="dims must be 1 to the vectors' dimension 10"):
        viz.plot_vector_strips(vectors, ["b"], tmp_path / "strips.png", dims=11)


@pytest.mark.parametrize("layout", ["interleaved", "split"])
def test_positional_pictures_draw_the_table_the_chosen_dimensions_and_a_curve_of_k_alone(
    kept, tmp_path, layout
):
    d, length, dims = 32, 120, [4, 5, 6, 7]
    viz.plot_positional_encoding(tmp_path / "pe.png", d, length, layout=layout, dims=dims)
    heat, curves, dots = kept[0].axes[:3]
    table = sinusoidal_table(length, d, layout, dtype=torch.float64)
    # the heat map is the table in that layout: dimensions up, positions across
    assert (heat.get_images()[0].get_array() == table.T.numpy()).all()
    # each chosen dimension's curve is its column of the table, named sin or cos rightly
    cosines = [dim >= d // 2 if layout == "split" else dim % 2 == 1 for dim in dims]
    for line, dim, cosine in zip(curves.get_lines(), dims, cosines, strict=True):
        assert line.get_label() == f"dim {dim} ({'cos' if cosine else 'sin'})"
        assert (line.get_ydata() == table[:, dim].numpy()).all()
    # the dot product curves from every start p are one curve, sum_i cos(k w_i)
    first, *others = [torch.from_numpy(line.get_ydata()) for line in dots.get_lines()]
    assert len(others) == 2
    for other in others:
        torch.testing.assert_close(other, first, atol=1e-6, rtol=0)
    w = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * (-math.log(10000.0) / d))
    k = torch.arange(length // 2, dtype=torch.float64)
    torch.testing.assert_close(first, torch.cos(k[:, None] * w).sum(1), atol=1e-9, rtol=0)


def test_the_split_layout_puts_every_sine_before_every_cosine(kept, tmp_path):
    viz.plot_positional_encoding(tmp_path / "pe.png", 16, 20, layout="split")
    heat = kept[0].axes[0].get_images()[0].get_array()
    assert (heat[:8, 0] == 0).all() and (heat[8:, 0] == 1).all()  # sin 0 and cos 0 at p = 0
    assert kept[0].axes[0].get_title() == "PE(p, dimension): sines, then cosines"


def test_positional_pictures_refuse_what_they_cannot_draw(tmp_path):
    with pytest.raises(AttnkitError, match="unknown layout 'zigzag'; choose interleaved or split"):
        viz.plot_positional_encoding(tmp_path / "pe.png", 16, 20, layout="zigzag")
    with pytest.raises(AttnkitError, match=r"must be 0 to 15, not \[3, 16\]"):
        viz.plot_positional_encoding(tmp_path / "pe.png", 16, 20, dims=[3, 16])


def test_a_small_models_picture_draws_each_default_dimension_once(kept, tmp_path):
    """d/2 of a 16-dimension model is 8, one of the fixed dimensions; 8 dimensions have no 8."""
    for d, drawn in ((16, ["dim 0", "dim 1", "dim 4", "dim 8"]), (8, ["dim 0", "dim 1", "dim 2",
                                                                      "dim 4"])):  # fmt: skip
        kept.clear()
        viz.plot_positional_encoding(tmp_path / "pe.png", d, 20)
        labels = [line.get_label().split(" (")[0] for line in kept[0].axes[1].get_lines()]
        assert labels == drawn


def test_the_word_vector_scatter_plots_each_words_first_two_principal_components(kept, tmp_path):
    """The points drawn, read from the figure, are the words' projections on the top two
    principal components (NumPy's SVD of the centred vectors, up to each axis's sign), each
    labelled with its word, and the axes give each component's share of the variance."""
    import numpy as np

    torch.manual_seed(0)
    words = ["king", "queen", "man", "woman", "dog", "cat"]
    table = torch.randn(len(words), 5) * torch.tensor([5.0, 3.0, 1.0, 0.5, 0.1])
    viz.plot_word_vectors(WordVectors(words, table), words, tmp_path / "w.png")
    ax = kept[0].axes[0]
    drawn = np.asarray(ax.collections[0].get_offsets(), dtype=np.float64)
    centred = table.double().numpy() - table.double().numpy().mean(0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    expected = centred @ vt[:2].T
    signs = np.sign((drawn * expected).sum(0))  # an eigenvector's sign is arbitrary
    np.testing.assert_allclose(drawn, expected * signs, atol=1e-5)
    labels = {t.get_text(): t.xy for t in ax.texts}
    assert set(labels) == set(words)
    for word, point in zip(words, drawn, strict=True):
        np.testing.assert_allclose(labels[word], point, atol=1e-5)
    share = s**2 / (s**2).sum()
    assert f"({100 * share[0]:.0f}% of the variance)" in ax.get_xlabel()
    assert f"({100 * share[1]:.0f}%)" in ax.get_ylabel()
