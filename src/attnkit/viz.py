"""Pictures: attention heat maps and training curves.

An attention map shows, for each query token (row), how its attention
weights softmax(QK^T / sqrt(d_k)) spread over the key tokens (columns).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display is needed or assumed

import matplotlib.pyplot as plt
import torch
from torch import Tensor

from attnkit.models import EncoderDecoder


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
    src_ids, tgt_ids = (torch.tensor([ids], device=model.device) for ids in (src, tgt))
    cross = model(src_ids, tgt_ids, need_weights=True).attentions["cross"]
    rows = [[w[0].mean(0) for w in cross]]
    titles = [f"decoder layer {i + 1}, mean of heads" for i in range(len(cross))]
    if last_layer_heads:
        rows.append(list(cross[-1][0]))
        titles += [f"decoder layer {len(cross)}, head {h + 1}" for h in range(len(rows[1]))]
    return plot_attention(
        rows,
        path,
        queries=[token(i) for i in tgt],
        keys=[token(i) for i in src],
        titles=titles,
        suptitle=suptitle,
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


def _save(fig: plt.Figure, path: str | Path) -> Path:
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
