"""Training objectives: what each model shape learns to predict.

Label-smoothed cross-entropy (section 5.4, epsilon_ls = 0.1): the target
distribution puts 1 - eps on the true token and spreads eps evenly over the
vocabulary of V tokens,

    q = (1 - eps) * onehot(y) + eps / V,    loss = -sum_v q_v log p_v
         = (1 - eps) * NLL(y) + eps * mean_v(-log p_v)

summed over real target tokens only (padding contributes nothing). An
objective returns sums and a token count rather than a mean, so the trainer
can divide by the token count of the whole global batch: accumulated
micro-batches and DDP ranks then give exactly the gradient of one big batch.

- translation: teacher forcing, the decoder reads <s> y_1 .. y_{n-1} and predicts y_1 .. </s>.
- language model: the same without an encoder.
- masked LM (BERT): 15% of real tokens are chosen; of those 80% become <mask>,
  10% a random token and 10% stay; only the chosen ones are predicted.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.data.batch import Batch
from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel

IGNORE = -100


@dataclass
class LossTerms:
    """Sums over the predicted tokens of one batch.

    loss: the training loss (label-smoothed when eps > 0).
    nll: the plain negative log-likelihood, for validation loss and perplexity.
    tokens: how many target tokens were predicted.
    """

    loss: Tensor
    nll: Tensor
    tokens: Tensor


def label_smoothed_cross_entropy(
    logits: Tensor, targets: Tensor, label_smoothing: float = 0.0
) -> LossTerms:
    """Summed label-smoothed cross-entropy; targets equal to IGNORE (-100) count for nothing.

    logits (..., V) and targets (...) of the same leading shape.
    """
    logp = logits.float().log_softmax(dim=-1).flatten(0, -2)
    targets = targets.flatten()
    keep = targets != IGNORE
    # Ignored rows are zeroed rather than removed: selecting the kept rows would copy the
    # whole (tokens, vocabulary) matrix forward and scatter it back in the backward pass.
    nll = F.nll_loss(logp, targets, ignore_index=IGNORE, reduction="none")
    loss = (
        nll
        if label_smoothing == 0
        else (1 - label_smoothing) * nll - label_smoothing * logp.mean(dim=-1) * keep
    )
    return LossTerms(loss.sum(), nll.sum(), keep.sum())


def _shifted_targets(tgt: Tensor, tgt_mask: Tensor | None) -> tuple[Tensor, Tensor | None, Tensor]:
    """Decoder input (all but the last token), its mask, and the next tokens to predict."""
    targets = tgt[:, 1:]
    if tgt_mask is not None:
        targets = targets.masked_fill(~tgt_mask[:, 1:].bool(), IGNORE)
    return tgt[:, :-1], None if tgt_mask is None else tgt_mask[:, :-1], targets


def _need(batch: Batch, *names: str, task: str) -> None:
    for name in names:
        if getattr(batch, name) is None:
            raise AttnkitError(f"a {task} batch needs `{name}`; check that the data fits the task")


class Objective(ABC):
    """Base: `objective(model, batch) -> LossTerms`; subclasses compute logits and targets."""

    task = ""

    def __init__(self, label_smoothing: float = 0.0) -> None:
        self.label_smoothing = label_smoothing

    def __call__(self, model: TransformerModel, batch: Batch) -> LossTerms:
        logits, targets = self.predict(model, batch)
        return label_smoothed_cross_entropy(logits, targets, self.label_smoothing)

    @abstractmethod
    def predict(self, model: TransformerModel, batch: Batch) -> tuple[Tensor, Tensor]:
        """Logits (batch, length, V) and the targets, IGNORE where nothing is predicted."""


class TranslationObjective(Objective):
    """Teacher-forced next-token prediction of the target given the source."""

    task = "translation"

    def predict(self, model: TransformerModel, batch: Batch) -> tuple[Tensor, Tensor]:
        _need(batch, "src", "tgt", task=self.task)
        dec_in, dec_mask, targets = _shifted_targets(batch.tgt, batch.tgt_mask)
        return model(batch.src, dec_in, batch.src_mask, dec_mask).logits, targets


class LanguageModelObjective(Objective):
    """Next-token prediction over `tgt` blocks."""

    task = "language-model"

    def predict(self, model: TransformerModel, batch: Batch) -> tuple[Tensor, Tensor]:
        _need(batch, "tgt", task=self.task)
        dec_in, dec_mask, targets = _shifted_targets(batch.tgt, batch.tgt_mask)
        return model(dec_in, dec_mask).logits, targets


class MaskedLMObjective(Objective):
    """Masked-token prediction over `src`; ids below `n_special` are never chosen."""

    task = "masked-lm"

    def __init__(
        self,
        mask_id: int,
        vocab_size: int,
        mask_prob: float = 0.15,
        n_special: int = 5,
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__(label_smoothing)
        self.mask_id, self.vocab_size = mask_id, vocab_size
        self.mask_prob, self.n_special = mask_prob, n_special

    def corrupt(self, ids: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """BERT's 80/10/10 corruption; returns the model input and the targets."""
        real = ids >= self.n_special
        if mask is not None:
            real &= mask.bool()
        chosen = real & (torch.rand(ids.shape, device=ids.device) < self.mask_prob)
        roll = torch.rand(ids.shape, device=ids.device)
        random_ids = torch.randint(self.n_special, self.vocab_size, ids.shape, device=ids.device)
        corrupted = torch.where(chosen & (roll < 0.8), self.mask_id, ids)
        corrupted = torch.where(chosen & (roll >= 0.8) & (roll < 0.9), random_ids, corrupted)
        return corrupted, ids.masked_fill(~chosen, IGNORE)

    def predict(self, model: TransformerModel, batch: Batch) -> tuple[Tensor, Tensor]:
        _need(batch, "src", task=self.task)
        inputs, targets = self.corrupt(batch.src, batch.src_mask)
        return model(inputs, batch.src_mask).logits, targets


def objective_for(
    shape: str,
    label_smoothing: float = 0.0,
    *,
    mask_id: int = 4,
    vocab_size: int = 0,
    mask_prob: float = 0.15,
) -> Objective:
    """The objective that trains a model of this `ModelConfig.shape`."""
    if shape == "encoder-decoder":
        return TranslationObjective(label_smoothing)
    if shape == "decoder":
        return LanguageModelObjective(label_smoothing)
    if shape == "encoder":
        return MaskedLMObjective(mask_id, vocab_size, mask_prob, label_smoothing=label_smoothing)
    raise AttnkitError(f"no objective for a model of shape {shape!r}")
