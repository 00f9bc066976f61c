"""Pictures: attention heat maps, training curves, word vectors and positional encodings.

An attention map shows, for each query token (row), how its attention
weights softmax(QK^T / sqrt(d_k)) spread over the key tokens (columns).
Word vectors are drawn projected on their first two principal components, or
as colour strips, one row of d coloured cells a word, so that similar words
show similar bands; the sinusoidal encoding PE(p, 2i) = sin(p w_i),
PE(p, 2i + 1) = cos(p w_i), w_i = 10000^(-2i/d) (or, in the `split` layout, the
sines in the first half and the cosines in the second), as a heat map, as
curves of chosen dimensions, and through the dot product
PE(p) . PE(p + k) = sum_i cos(k w_i), which depends on the offset k alone.
`plot_model_positions` draws a model's own method: its learned table and how
alike its positions are; RoPE's wavelengths and the score (1/P) sum_i cos(k theta_i)
a query gives an equal key k positions away (times zeta_i^(k/B) for xPos);
ALiBi's bias -m_h k of each head.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display is needed or assumed

import matplotlib.pyplot as plt
import torch
from matplotlib.backend_bases import FigureCanvasBase
from torch import Tensor

from attnkit.config import SINUSOIDAL_LAYOUTS
from attnkit.embeddings.vectors import WordVectors
from attnkit.errors import AttnkitError
from attnkit.files import atomic_write, check_writable
from attnkit.models import EncoderDecoder, TransformerModel
from attnkit.nn.positional import XPOS_GAMMA, alibi_slopes, rope_frequencies, sinusoidal_table


def plot_attention(
    weights: Tensor | Sequence[Tensor] | Sequence[Sequence[Tensor]],
    path: str | Path,
    *,
    queries: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    titles: Sequence[str] | None = None,
    suptitle: str | None = None,
) -> Path:
    """Write heat maps of (queries, keys) matrices to a PNG, one row of panels per group.

    `weights` is a (queries, keys) matrix, a (n, queries, keys) tensor, a list
    of matrices (one row: for example one per layer), or a list of such lists
    (several rows: for example the layers, then the heads of one layer).
    `titles` name the panels in reading order.
    """
    if isinstance(weights, Tensor):
        weights = [weights] if weights.dim() == 2 else list(weights)
    rows = [list(row) for row in weights] if not isinstance(weights[0], Tensor) else [weights]
    n_cols = max(len(row) for row in rows)
    fig, axes = plt.subplots(
        len(rows), n_cols, figsize=(3.2 * n_cols + 0.8, 3.6 * len(rows)), squeeze=False
    )
    panel_titles = iter(titles or [])
    for r, row in enumerate(rows):
        for c, ax in enumerate(axes[r]):
            if c >= len(row):
                ax.axis("off")
                continue
            ax.imshow(
                row[c].detach().float().cpu().numpy(), cmap="viridis", vmin=0.0, aspect="auto"
            )
            ax.set_title(next(panel_titles, ""), fontsize=9)
            if keys is not None:
                ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=7)
            if queries is not None:
                ax.set_yticks(range(len(queries)), queries, fontsize=7)
            ax.set_xlabel("key (source)", fontsize=8)
            ax.set_ylabel("query (target)" if c == 0 else "", fontsize=8)
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    return _save(fig, path)


@torch.no_grad()
def plot_cross_attention(
    model: EncoderDecoder,
    src: Sequence[int],
    tgt: Sequence[int],
    path: str | Path,
    *,
    token: Callable[[int], str],
    last_layer_heads: bool = True,
    suptitle: str = "cross-attention",
) -> Path:
    """Cross-attention of one source and its target, each decoder layer as the mean of its heads.

    `tgt` is the decoder's input (it starts with the start token); `token`
    names an id on the axes. With `last_layer_heads` a second row shows each
    head of the last layer on its own.
    """
    return plot_model_attention(
        model, src, path, kind="cross", tgt=tgt, token=token,
        last_layer_heads=last_layer_heads, suptitle=suptitle,
    )  # fmt: skip


@torch.no_grad()
def plot_model_attention(
    model: torch.nn.Module,
    ids: Sequence[int],
    path: str | Path,
    *,
    kind: str,
    token: Callable[[int], str],
    tgt: Sequence[int] | None = None,
    last_layer_heads: bool = True,
    suptitle: str | None = None,
) -> Path:
    """One attention of a model on one text, each layer as the mean of its heads (and the last
    layer's heads on their own): `kind` is "cross", "encoder" or "decoder" (an
    encoder-decoder reads `ids` as the source and `tgt` as the decoder's input), the
    self-attention of a decoder ("decoder") or of an encoder ("encoder") reads `ids`."""
    device = next(model.parameters()).device
    src_ids = torch.tensor([list(ids)], device=device)
    if isinstance(model, EncoderDecoder):
        if tgt is None:
            raise AttnkitError("an encoder-decoder's attention needs the target's ids (tgt).")
        out = model(src_ids, torch.tensor([list(tgt)], device=device), need_weights=True)
    else:
        out = model(src_ids, need_weights=True)
    if kind not in out.attentions:
        raise AttnkitError(
            f"this model has no {kind} attention; it has {', '.join(out.attentions)}."
        )
    layers = out.attentions[kind]
    queries = ids if kind == "encoder" or tgt is None else tgt
    keys = tgt if kind == "decoder" and tgt is not None else ids
    name = {"cross": "cross-attention", "encoder": "encoder self-attention",
            "decoder": "decoder self-attention"}[kind]  # fmt: skip
    stack = "encoder" if kind == "encoder" else "decoder"
    rows = [[w[0].mean(0) for w in layers]]
    titles = [f"{stack} layer {i + 1}, mean of heads" for i in range(len(layers))]
    if last_layer_heads:
        rows.append(list(layers[-1][0]))
        titles += [f"{stack} layer {len(layers)}, head {h + 1}" for h in range(len(rows[1]))]
    return plot_attention(
        rows,
        path,
        queries=[token(i) for i in queries],
        keys=[token(i) for i in keys],
        titles=titles,
        suptitle=suptitle or name,
    )


def plot_curves(records: Sequence[dict[str, float]], path: str | Path) -> Path:
    """Loss curves (training and validation) and every other validation metric, by step, to a PNG.

    `records` are the lines of a run's metrics.jsonl: each has a `step` and some
    of `train_loss`, `val_loss`, `val_ppl`, `lr` and extra metrics such as `bleu`.
    The learning rate is drawn on its own axis beside the losses, so a bend in
    the loss can be read against the warmup and decay.
    """
    skip = {"step", "minutes", "lr", "tokens_per_s", "train_loss", "val_loss", "val_ppl"}
    extra = sorted({k for r in records for k in r} - skip)
    rates = [(r["step"], r["lr"]) for r in records if "lr" in r]
    fig, axes = plt.subplots(1, 1 + len(extra), figsize=(5 * (1 + len(extra)), 3.6), squeeze=False)
    for ax, keys in zip(axes[0], [("train_loss", "val_loss"), *[(k,) for k in extra]], strict=True):
        for key in keys:
            points = [(r["step"], r[key]) for r in records if key in r]
            if points:
                steps, values = zip(*points, strict=True)
                ax.plot(steps, values, marker="o" if len(points) < 30 else None, label=key)
        ax.set_xlabel("step")
        ax.set_title("loss (nats per token)" if keys[0] == "train_loss" else keys[0], fontsize=10)
        ax.grid(alpha=0.3)
        lines = ax.get_lines()
        if keys[0] == "train_loss" and rates:
            twin = ax.twinx()
            steps, values = zip(*rates, strict=True)
            twin.plot(steps, values, color="grey", linestyle="--", linewidth=1, label="lr")
            twin.set_ylabel("learning rate", fontsize=8)
            twin.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
            lines += twin.get_lines()
        ax.legend(lines, [line.get_label() for line in lines], fontsize=8)
    return _save(fig, path)


def plot_word_vectors(vectors: WordVectors, words: Sequence[str], path: str | Path) -> Path:
    """The chosen words' vectors projected on their first two principal components, labelled."""
    if len(words) < 3:
        raise AttnkitError("a picture of word vectors needs at least three words.")
    points = torch.stack([vectors[w] for w in words]).double()
    points = points - points.mean(0)
    _, s, v = torch.linalg.svd(points, full_matrices=False)
    xy = (points @ v[:2].T).numpy()
    share = (s[:2] ** 2 / (s**2).sum()).tolist()
    fig, ax = plt.subplots(figsize=(7, 6))
    ax.scatter(xy[:, 0], xy[:, 1], s=14)
    for (x, y), word in zip(xy.tolist(), words, strict=True):
        ax.annotate(word, (x, y), xytext=(3, 3), textcoords="offset points", fontsize=9)
    ax.set_xlabel(f"principal component 1 ({100 * share[0]:.0f}% of the variance)")
    ax.set_ylabel(f"principal component 2 ({100 * share[1]:.0f}%)")
    ax.set_title(f"{len(words)} word vectors of dimension {vectors.dim}", fontsize=10)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_vector_strips(
    vectors: WordVectors, words: Sequence[str], path: str | Path, *, dims: int | None = None
) -> Path:
    """Each word's vector as a strip of coloured cells, one row a word, the first `dims`
    dimensions (all by default); red positive, blue negative, on one scale for all rows."""
    if not words:
        raise AttnkitError("a picture of word vectors needs at least one word.")
    dims = vectors.dim if dims is None else dims
    if not 1 <= dims <= vectors.dim:
        raise AttnkitError(f"dims must be 1 to the vectors' dimension {vectors.dim}, not {dims}.")
    rows = torch.stack([vectors[w][:dims] for w in words]).double()
    bound = float(rows.abs().max()) or 1.0
    fig, ax = plt.subplots(figsize=(min(2 + 0.12 * dims, 16), 0.8 + 0.4 * len(words)))
    image = ax.imshow(
        rows.numpy(), aspect="auto", cmap="RdBu_r", vmin=-bound, vmax=bound,
        interpolation="nearest",
    )  # fmt: skip
    ax.set_yticks(range(len(words)), list(words), fontsize=9)
    ax.set_xlabel("dimension")
    ax.set_title(f"{len(words)} word vectors, dimensions 0 to {dims - 1}", fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.02)
    return _save(fig, path)


POSITION_DIMS = (0, 1, 8)  # with d/4 and d/2: fast, middle and slow waves
# The most positions x dimensions a picture of the encoding draws. Drawing costs about 70
# bytes a cell (the float64 table, its dot products, matplotlib's image), so this bounds a
# picture near 70 MB; no screen shows more cells than this anyway. 3,000,000 positions of
# 128 dimensions would need some 22 GB.
POSITION_PICTURE_CELLS = 1_000_000


def plot_positional_encoding(
    path: str | Path,
    d_model: int = 128,
    length: int = 100,
    *,
    layout: str = "interleaved",
    dims: Sequence[int] | None = None,
) -> Path:
    """The sinusoidal encoding as a heat map (positions x dimensions) in `layout`
    (`interleaved`: sin and cos alternate; `split`: every sine, then every cosine), the
    dimensions `dims` as curves over the positions (by default 0, 1, 8, d/4 and d/2), and
    PE(p) . PE(p + k) against k from three positions p. Computed in float64; at most
    `POSITION_PICTURE_CELLS` positions x dimensions."""
    if d_model < 8 or d_model % 2 or length < 8:
        raise AttnkitError("the picture needs an even d_model and a length, both 8 or more.")
    if layout not in SINUSOIDAL_LAYOUTS:
        raise AttnkitError(f"unknown layout {layout!r}; choose {' or '.join(SINUSOIDAL_LAYOUTS)}.")
    if length * d_model > POSITION_PICTURE_CELLS:
        raise AttnkitError(
            f"a picture of {length:,} positions x {d_model:,} dimensions has "
            f"{length * d_model:,} cells, more than the {POSITION_PICTURE_CELLS:,} one draws "
            "(attnkit.viz.POSITION_PICTURE_CELLS); give a smaller --length or --d-model."
        )
    if not dims:  # each once, in order, within a small model's dimensions
        dims = sorted({*POSITION_DIMS, d_model // 4, d_model // 2} & set(range(d_model)))
    dims = list(dims)
    if not dims or any(not 0 <= d < d_model for d in dims):
        raise AttnkitError(f"the dimensions drawn must be 0 to {d_model - 1}, not {dims}.")
    table = sinusoidal_table(length, d_model, layout, dtype=torch.float64)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    image = axes[0].imshow(
        table.T.numpy(), aspect="auto", cmap="RdBu", vmin=-1, vmax=1, origin="lower"
    )
    title = "PE(p, dimension)" + (": sines, then cosines" if layout == "split" else "")
    axes[0].set(xlabel="position p", ylabel="dimension", title=title)
    fig.colorbar(image, ax=axes[0], fraction=0.04)
    half = d_model // 2
    for dim in dims:
        cosine = dim >= half if layout == "split" else dim % 2 == 1
        axes[1].plot(table[:, dim].numpy(), label=f"dim {dim} ({'cos' if cosine else 'sin'})")
    axes[1].set(xlabel="position p", title="a wavelength per dimension pair")
    axes[1].legend(fontsize=8)
    offsets = torch.arange(length // 2)
    for start in (0, length // 4, length // 2 - 1):
        dots = table[start + offsets] @ table[start]
        axes[2].plot(
            offsets.numpy(),
            dots.numpy(),
            label=f"from p = {start}",
            linestyle="-" if start else "--",
        )
    axes[2].set(xlabel="offset k", title="PE(p) . PE(p + k): the same for every p")
    axes[2].legend(fontsize=8)
    for ax in axes[1:]:
        ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_model_positions(model: TransformerModel, path: str | Path, length: int = 100) -> Path:
    """How `model`'s positional method (`ModelConfig.positional`) tells positions apart, over
    its first `length` positions (at most its max_len)."""
    c = model.config
    length = max(8, min(length, c.max_len))
    if c.positional == "sinusoidal":
        return plot_positional_encoding(path, c.d_model - c.d_model % 2, length)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    if c.positional == "learned":
        embed = model.src_embed if isinstance(model, EncoderDecoder) else model.embed
        table = embed.positions.table.detach().float()[:length]
        image = axes[0].imshow(table.T.numpy(), aspect="auto", cmap="RdBu", origin="lower")
        axes[0].set(xlabel="position p", ylabel="dimension", title="learned P(p, dimension)")
        fig.colorbar(image, ax=axes[0], fraction=0.04)
        unit = torch.nn.functional.normalize(table, dim=-1)
        image = axes[1].imshow((unit @ unit.T).numpy(), cmap="viridis", vmin=-1, vmax=1)
        axes[1].set(xlabel="position", ylabel="position", title="cosine of P(p) and P(q)")
        fig.colorbar(image, ax=axes[1], fraction=0.04)
    elif c.positional in ("rope", "xpos"):
        theta = rope_frequencies(c.d_head, c.rope_theta, c.rope_scaling, c.rope_scaling_type,
                                 c.rope_original_max_len)  # fmt: skip
        pairs = torch.arange(len(theta), dtype=torch.float64)
        axes[0].semilogy(pairs.numpy(), (2 * torch.pi / theta).numpy(), "o-", markersize=3)
        axes[0].set(
            xlabel="pair i",
            ylabel="wavelength 2 pi / theta_i (positions)",
            title=f"{c.positional}: each pair of a head's {c.d_head} dimensions turns",
        )
        k = torch.arange(length, dtype=torch.float64)
        score = torch.cos(k[:, None] * theta[None])
        if c.positional == "xpos":
            zeta = (2 * pairs / c.d_head + XPOS_GAMMA) / (1 + XPOS_GAMMA)
            score = score * zeta[None] ** (k[:, None] / c.xpos_scale_base)
        axes[1].plot(k.numpy(), score.mean(1).numpy())
        axes[1].set(xlabel="distance k", ylabel="score",
                    title="what an equal key k positions away scores")  # fmt: skip
    elif c.positional == "alibi":
        slopes = alibi_slopes(c.n_heads)
        k = torch.arange(length)
        for h, m in enumerate(slopes.tolist()):
            axes[0].plot(k.numpy(), (-m * k).numpy(), label=f"head {h + 1}: m = {m:.3g}")
        axes[0].set(xlabel="distance k", ylabel="bias -m k", title="ALiBi: a slope per head")
        axes[0].legend(fontsize=7, ncol=2)
        bias = -slopes[0] * (k[:, None] - k[None]).abs().float()
        causal = c.shape != "encoder"
        if causal:
            bias = bias.masked_fill(k[None] > k[:, None], float("nan"))
        image = axes[1].imshow(bias.numpy(), cmap="viridis")
        side = "causal" if causal else "both ways"
        axes[1].set(xlabel="key", ylabel="query", title=f"head 1's bias ({side})")
        fig.colorbar(image, ax=axes[1], fraction=0.04)
    else:
        for ax in axes:
            ax.axis("off")
        axes[0].text(0, 0.5, "no positional encoding: a causal decoder reads position\n"
                     "from what its mask lets each token see", fontsize=12)  # fmt: skip
    for ax in axes:
        if ax.lines:
            ax.grid(alpha=0.3)
    return _save(fig, path)


def check_picture(
    path: str | Path, what: str = "the picture", inputs: Sequence[tuple[str, Path]] = ()
) -> Path:
    """Stop before any work when no picture can be written at `path`: its suffix is no
    picture type matplotlib writes (.png, .svg, .pdf, ...), or `check_writable` refuses it."""
    path = check_writable(path, what, inputs=inputs)
    types = FigureCanvasBase.get_supported_filetypes()
    if path.suffix.lower().lstrip(".") not in types:
        known = ", ".join(f".{kind}" for kind in sorted(types))
        raise AttnkitError(
            f"{what} {path} needs a picture type as its suffix ({known}); .png is the usual one"
        )
    return path


def _save(fig: plt.Figure, path: str | Path) -> Path:
    path = check_picture(path)
    fig.tight_layout()
    try:
        # The type by the name's suffix, since the file is written under a temporary name.
        kind = path.suffix.lower().lstrip(".")
        return atomic_write(path, lambda p: fig.savefig(p, dpi=120, format=kind))
    finally:
        plt.close(fig)
