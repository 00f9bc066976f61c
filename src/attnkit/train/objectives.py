"""Training objectives: what each model shape learns to predict.

Each objective runs the model on a batch up to its last hidden states and
scores them with the label-smoothed cross-entropy of `cross_entropy.py`, fused
with the model's output projection (the logits are never held whole). It
returns sums and a token count rather than a mean, so the trainer can divide
by the token count of the whole global batch: accumulated micro-batches and
DDP ranks then give exactly the gradient of one big batch. A model with a
mixture of experts also gets router_aux_loss_coef times its load-balancing
loss (`nn/moe.py`), in `LossTerms.aux`.

- translation: teacher forcing, the decoder reads <s> y_1 .. y_{n-1} and predicts y_1 .. </s>;
  through a pointer-generator (`nn/copy.py`) the loss is that of its mixture P.
- language model: the same without an encoder.
- masked LM (BERT): 15% of real tokens are chosen; of those 80% become <mask>,
  10% a random token and 10% stay; only the chosen ones are predicted.

`TrainingObjective` is what the Trainer takes: `Objective`, these cross-entropies,
or another loss, as DPO's over preference pairs (`train/preference.py`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnkit.data.batch import Batch, shift_targets
from attnkit.errors import AttnkitError
from attnkit.models.base import unwrap
from attnkit.nn.moe import router_aux_loss
from attnkit.train.cross_entropy import (
    IGNORE,
    LossTerms,
    copy_cross_entropy,
    linear_cross_entropy,
)


def _need(batch: Batch, *names: str, task: str) -> None:
    for name in names:
        if getattr(batch, name) is None:
            raise AttnkitError(f"a {task} batch needs `{name}`; check that the data fits the task")


class TrainingObjective(ABC):
    """What the Trainer minimises: `objective(model, batch) -> LossTerms`, sums over the
    batch's units (its target tokens; DPO's pairs) and their count, which the Trainer divides
    by over the whole global batch.

    `model` may be wrapped (DDP, torch.compile).
    """

    task = ""
    # Whether one step's gradient comes from one forward pass with gradient, which is what
    # DistributedDataParallel can synchronise (the Trainer refuses the others under torchrun).
    one_forward = True

    def __init__(self) -> None:
        self.step = 0  # optimizer steps done, set by the Trainer; schedules read it

    def start_step(self, step: int) -> None:
        """The Trainer calls this before each optimizer step with the steps done so far."""
        self.step = step

    @abstractmethod
    def __call__(self, model: nn.Module, batch: Batch) -> LossTerms:
        """The sums of one batch."""


class Objective(TrainingObjective):
    """The cross-entropy of the tokens a model predicts; subclasses compute hidden states and
    targets, and the head is read from the plain model."""

    # The loss over the head: (hidden, weight, bias, targets, label_smoothing) -> LossTerms; the
    # Trainer swaps in `chunked_cross_entropy` where `train.cross_entropy` asks.
    head_loss: Callable[..., LossTerms] = staticmethod(linear_cross_entropy)

    def __init__(self, label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.label_smoothing = label_smoothing

    def use_head_loss(self, head_loss: Callable[..., LossTerms]) -> None:
        """Compute the loss over the head with `head_loss` from now on."""
        self.head_loss = head_loss

    def __call__(self, model: nn.Module, batch: Batch) -> LossTerms:
        hidden, targets = self.predict(model, batch)
        head = unwrap(model).head
        terms = self.head_loss(hidden, head.weight, head.bias, targets, self.label_smoothing)
        return with_router_loss(model, terms)

    @abstractmethod
    def predict(self, model: nn.Module, batch: Batch) -> tuple[Tensor, Tensor]:
        """Last hidden states (batch, length, d_model) and the targets, IGNORE where nothing
        is predicted; the head turns the hidden states into logits."""


def with_router_loss(model: nn.Module, terms: LossTerms) -> LossTerms:
    """`terms` with a mixture of experts' load-balancing loss in `aux`, if the model has one."""
    plain = unwrap(model)
    coef = plain.config.router_aux_loss_coef
    if plain.config.n_experts and coef:
        aux = router_aux_loss(plain)  # None in evaluation mode
        if aux is not None:
            # Times the tokens: the trainer divides the step's sums by its token count,
            # so each step adds coef * L_aux (token-weighted over micro-batches).
            terms.aux = coef * aux * terms.tokens
    return terms


class NextTokenObjective(Objective):
    """Teacher forcing: the decoder reads <s> y_1 .. y_{n-1} and predicts y_1 .. </s>.

    `run` is the one pass of the model over given decoder inputs, which scheduled
    sampling (`train/scheduled_sampling.py`) and sequence-level training
    (`train/sequence_level.py`) call with inputs other than the gold prefix.
    """

    needs: tuple[str, ...] = ("tgt",)

    def predict(self, model: nn.Module, batch: Batch) -> tuple[Tensor, Tensor]:
        dec_in, dec_mask, targets = self.teacher_forced(batch)
        return self.run(model, batch, dec_in, dec_mask), targets

    def teacher_forced(self, batch: Batch) -> tuple[Tensor, Tensor | None, Tensor]:
        """The gold decoder inputs, their mask, and the targets (IGNORE at padding)."""
        _need(batch, *self.needs, task=self.task)
        return shift_targets(batch.tgt, batch.tgt_mask, ignore=IGNORE)

    @abstractmethod
    def run(
        self,
        model: nn.Module,
        batch: Batch,
        dec_in: Tensor,
        dec_mask: Tensor | None,
        repeat: int = 1,
    ) -> Tensor:
        """Last hidden states of the model reading `dec_in` (and the batch's source, if any);
        with `repeat`, `dec_in` holds that many consecutive rows for each row of the batch."""


class TranslationObjective(NextTokenObjective):
    """Next-token prediction of the target given the source."""

    task = "translation"
    needs = ("src", "tgt")

    def run(
        self,
        model: nn.Module,
        batch: Batch,
        dec_in: Tensor,
        dec_mask: Tensor | None,
        repeat: int = 1,
    ) -> Tensor:
        if repeat == 1:
            return model(batch.src, dec_in, batch.src_mask, dec_mask, need_logits=False).hidden
        # Several targets per source (sequence-level training's candidates): encode it once.
        plain = unwrap(model)
        memory = plain.encode(batch.src, batch.src_mask).repeat_interleave(repeat, 0)
        src_mask = None if batch.src_mask is None else batch.src_mask.repeat_interleave(repeat, 0)
        return plain.decode(dec_in, memory, src_mask, dec_mask, need_logits=False)


class CopyObjective(TranslationObjective):
    """Teacher forcing through a pointer-generator: the label-smoothed cross-entropy of its
    mixture P over the extended vocabulary (`copy_cross_entropy`), which no fused head gives."""

    def use_head_loss(self, head_loss: Callable[..., LossTerms]) -> None:
        raise AttnkitError(
            "train.cross_entropy 'chunked' needs a loss over the model's head alone, and a "
            "pointer-generator's mixes copy scores into it; use 'fused'"
        )

    def __call__(self, model: nn.Module, batch: Batch) -> LossTerms:
        dec_in, dec_mask, targets = self.teacher_forced(batch)
        log_p = model(batch.src, dec_in, batch.src_mask, dec_mask).logits
        vocab_size = unwrap(model).config.vocab_size
        terms = copy_cross_entropy(log_p, targets, vocab_size, self.label_smoothing)
        return with_router_loss(model, terms)


class LanguageModelObjective(NextTokenObjective):
    """Next-token prediction over `tgt` blocks."""

    task = "language-model"

    def run(
        self,
        model: nn.Module,
        batch: Batch,
        dec_in: Tensor,
        dec_mask: Tensor | None,
        repeat: int = 1,
    ) -> Tensor:
        return model(dec_in, dec_mask, need_logits=False).hidden  # no source to share


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

    def predict(self, model: nn.Module, batch: Batch) -> tuple[Tensor, Tensor]:
        _need(batch, "src", task=self.task)
        inputs, targets = self.corrupt(batch.src, batch.src_mask)
        return model(inputs, batch.src_mask, need_logits=False).hidden, targets


def objective_for(
    shape: str,
    label_smoothing: float = 0.0,
    *,
    mask_id: int = 4,
    vocab_size: int = 0,
    mask_prob: float = 0.15,
    copy: bool = False,
) -> Objective:
    """The objective that trains a model of this `ModelConfig.shape` (`copy`: with a
    pointer-generator output)."""
    if shape == "encoder-decoder":
        return (CopyObjective if copy else TranslationObjective)(label_smoothing)
    if shape == "decoder":
        return LanguageModelObjective(label_smoothing)
    if shape == "encoder":
        return MaskedLMObjective(mask_id, vocab_size, mask_prob, label_smoothing=label_smoothing)
    raise AttnkitError(f"no objective for a model of shape {shape!r}")
