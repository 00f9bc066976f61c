"""Pictures: attention heat maps.

An attention map shows, for each query token (row), how its attention
weights softmax(QK^T / sqrt(d_k)) spread over the key tokens (columns).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display is needed or assumed

import matplotlib.pyplot as plt
from torch import Tensor


def plot_attention(
    weights: Tensor | Sequence[Tensor],
    path: str | Path,
    *,
    queries: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    titles: Sequence[str] | None = None,
    suptitle: str | None = None,
) -> Path:
    """Write one heat map per (queries, keys) matrix, side by side, to a PNG.

    `weights` is a (queries, keys) matrix, a (n, queries, keys) tensor or a list
    of matrices (for example one per layer or per head).
    """
    mats = [weights] if isinstance(weights, Tensor) and weights.dim() == 2 else list(weights)
    fig, axes = plt.subplots(1, len(mats), figsize=(3.2 * len(mats) + 0.8, 3.6), squeeze=False)
    for i, (ax, mat) in enumerate(zip(axes[0], mats, strict=True)):
        ax.imshow(mat.detach().float().cpu().numpy(), cmap="viridis", vmin=0.0, aspect="auto")
        if titles is not None:
            ax.set_title(titles[i], fontsize=9)
        if keys is not None:
            ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=7)
        if queries is not None:
            ax.set_yticks(range(len(queries)), queries, fontsize=7)
        ax.set_xlabel("key (source)", fontsize=8)
        ax.set_ylabel("query (target)" if i == 0 else "", fontsize=8)
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
