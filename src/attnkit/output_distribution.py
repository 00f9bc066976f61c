"""The model's output distribution against the one-hot target: the two sides of the loss.

At each position t the model gives a distribution over the vocabulary,
p_t = softmax(logits_t); training's target is the one-hot vector y_t of the token that
comes next. Cross-entropy compares them,

    H(y_t, p_t) = -sum_v y_t(v) log p_t(v) = -log p_t(target_t),

so only the target's probability counts: a model before training spreads p_t almost
evenly (-log p_t(target) near log V), a trained one puts its mass on the target.
`target_distributions` reads p_t for a chosen sentence; `plot_output_distribution` draws
them, before and after training (the `attnkit distribution` command).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, as attnkit.viz draws

import matplotlib.pyplot as plt
import torch
from torch import Tensor

from attnkit.errors import AttnkitError
from attnkit.files import atomic_write
from attnkit.models import TransformerModel
from attnkit.tokenizer import Tokenizer
from attnkit.viz import check_picture


@dataclass(frozen=True)
class TargetDistributions:
    """p_t over the vocabulary (positions, vocab) and each position's target id and token."""

    probs: Tensor
    targets: Tensor
    tokens: list[str]

    @property
    def target_probs(self) -> Tensor:
        """p_t(target_t) for each position t."""
        return self.probs[torch.arange(len(self.targets)), self.targets]

    @property
    def losses(self) -> Tensor:
        """The cross-entropy -log p_t(target_t) of each position, in nats."""
        return -self.target_probs.log()


@torch.no_grad()
def target_distributions(
    model: TransformerModel, tokenizer: Tokenizer, text: str, source: str | None = None
) -> TargetDistributions:
    """The output distributions a model gives at each position of `text`, teacher-forced.

    A language model reads `text`'s tokens and predicts each from those before it; a
    translation model reads `source` and predicts `text` (with its end token) from <s>.
    """
    shape = model.config.shape
    if shape == "encoder":
        raise AttnkitError(
            "an encoder model predicts no next token; use a decoder or translation run"
        )
    if (source is None) != (shape == "decoder"):
        need = "a source sentence (--source)" if shape != "decoder" else "no source sentence"
        raise AttnkitError(f"a {shape} model needs {need} for its output distribution")
    if shape == "decoder":
        ids = tokenizer.encode(text)
    else:
        ids = tokenizer.encode(text, add_bos=True, add_eos=True)
    if len(ids) < 2:
        raise AttnkitError(f"{text!r} is one token or none; give at least two to predict one")
    if len(ids) - 1 > model.config.max_len:
        raise AttnkitError(
            f"{text!r} has {len(ids)} tokens, over the model's max_len {model.config.max_len}; "
            "give a shorter sentence"
        )
    inputs, targets = torch.tensor([ids[:-1]]), torch.tensor(ids[1:])
    was_training = model.training
    model.eval()
    try:
        if shape == "decoder":
            logits = model(inputs).logits[0]
        else:
            src = tokenizer.encode(source, add_eos=True)[: model.config.max_len]
            logits = model(torch.tensor([src]), inputs).logits[0]
    finally:
        model.train(was_training)
    # log_softmax also normalises a pointer-generator's log-probabilities (unchanged)
    probs = logits.float().log_softmax(-1).exp()
    tokens = [tokenizer.id_to_token(i) or "?" for i in ids[1:]]
    return TargetDistributions(probs, targets, tokens)


def plot_output_distribution(
    sides: Sequence[tuple[str, Tensor]],
    targets: Tensor,
    tokens: Sequence[str],
    path: str | Path,
    *,
    top: int = 10,
) -> Path:
    """Each position's output distribution p_t beside its one-hot target: one row of panels a
    side (`sides`: a title and its (positions, vocab) probabilities, e.g. before and after
    training), one panel a position, the target's bar and the `top` most likely others drawn
    as bars, the one-hot target as an outline at 1 on the target's bar.

    The numbers drawn are the probabilities given: bar heights are p_t(v); titles give
    p_t(target) and the cross-entropy -log p_t(target).
    """
    if not sides or not len(targets):
        raise AttnkitError("a picture of output distributions needs a side and a position.")
    n = len(targets)
    fig, axes = plt.subplots(
        len(sides), n, figsize=(2.2 * n + 0.8, 2.6 * len(sides)), squeeze=False, sharey=True
    )
    for row, (name, probs) in zip(axes, sides, strict=True):
        for t, ax in enumerate(row):
            p, target = probs[t].double(), int(targets[t])
            others = [i for i in p.argsort(descending=True).tolist() if i != target][: top - 1]
            shown = [target, *others]
            heights = p[shown].tolist()
            ax.bar(range(len(shown)), heights, color=["tab:green"] + ["tab:blue"] * len(others))
            ax.bar([0], [1.0], fill=False, edgecolor="black", linestyle="--", label="one-hot")
            ax.set_ylim(0, 1.05)
            ax.set_xticks([0], [repr(tokens[t])[1:-1]], fontsize=8)
            loss = -float(p[target].clamp_min(1e-45).log())
            ax.set_title(f"{name}: p = {heights[0]:.3f}\n-log p = {loss:.2f}", fontsize=8)
    axes[0][0].set_ylabel("probability")
    axes[-1][0].legend(fontsize=7, loc="upper right")
    fig.suptitle("output distribution (bars: the target, then the most likely others)", fontsize=10)
    path = check_picture(path)
    fig.tight_layout()
    try:
        kind = path.suffix.lower().lstrip(".")  # written under a temporary name: say the type
        return atomic_write(path, lambda p: fig.savefig(p, dpi=120, format=kind))
    finally:
        plt.close(fig)
