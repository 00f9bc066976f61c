"""Direct preference optimisation (Rafailov et al. 2023, "Direct Preference Optimization: Your
Language Model is Secretly a Reward Model"): preference tuning without a reward model.

Given a prompt x, a response a person preferred, y_w, and one they did not, y_l,
DPO raises the policy's likelihood of y_w relative to a frozen reference model
and lowers that of y_l (eq. 7):

    L_DPO = -log sigmoid( beta log pi(y_w|x)/pi_ref(y_w|x) - beta log pi(y_l|x)/pi_ref(y_l|x) )

where log pi(y|x) is the sum of the log-probabilities of y's tokens given x: after
the prompt in one sequence for a decoder-only model (as TRL, torchtune and litgpt
train them), or with the prompt as the encoder's source for an encoder-decoder
(the decoder teacher-forced on <s> y </s>). beta log pi/pi_ref is the "implicit
reward" of a response; the chosen-minus-rejected difference of the two is the
margin, which training pushes up.

The reference is the run being fine-tuned, frozen at the start: a copy of it,
or, when the model trains through LoRA adapters (`nn/lora.py`), the same model
with the adapters' update switched off, which costs no second copy.

`data.task = "preference"` trains it from a run config (`attnkit.train.tasks`,
the pairs from `attnkit.data.preference`), with the [dpo] section below, and
validates it by `preference_metric`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.checks import check, finite_fields, with_article
from attnkit.data.preference import PreferenceBatch
from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel
from attnkit.models.base import unwrap
from attnkit.nn.lora import LoRALinear, has_lora
from attnkit.train.cross_entropy import LossTerms
from attnkit.train.metrics import Metric
from attnkit.train.objectives import TrainingObjective, with_router_loss


@dataclass(frozen=True)
class DPOSection:
    """Direct preference optimisation (`data.task = "preference"`), fine-tuning the run of
    `train.init_from` against itself, frozen, as the reference.

    beta: how far the policy may move from the reference: the scale of the implicit reward
        beta log pi/pi_ref (the paper: 0.1 to 0.5; smaller keeps closer to the reference).
    """

    beta: float = 0.1

    def __post_init__(self) -> None:
        finite_fields(self, "dpo")
        check(self.beta > 0, f"dpo.beta must be positive, got {self.beta!r}")


def response_log_probs(model: nn.Module, batch: PreferenceBatch) -> Tensor:
    """log pi(y|x) of each row (rows,): the sum of the log-probabilities of its scored tokens,
    each predicted from those before it, and from the prompt as the source for an
    encoder-decoder."""
    shape = unwrap(model).config.shape
    reads, mask = batch.tgt[:, :-1], batch.tgt_mask[:, :-1]
    if shape == "encoder-decoder":
        check(
            batch.src is not None,
            "an encoder-decoder reads the prompt as its source, but this preference batch "
            "holds prompt and response in one sequence; make it with decoder_start_id",
        )
        logits = model(batch.src, reads, batch.src_mask, mask).logits
    elif shape == "decoder":
        check(
            batch.src is None,
            "a decoder-only model reads prompt and response in one sequence, but this "
            "preference batch has sources; make it without decoder_start_id",
        )
        logits = model(reads, mask).logits
    else:
        raise AttnkitError(
            f"DPO scores the responses of a decoder or an encoder-decoder model, not of "
            f"{with_article(shape)} one"
        )
    token = logits.float().log_softmax(-1).gather(-1, batch.tgt[:, 1:, None]).squeeze(-1)
    return token.masked_fill(~batch.scored[:, 1:], 0.0).sum(-1)


def dpo_margins(
    chosen: Tensor, rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor, beta: float
) -> Tensor:
    """beta (log pi/pi_ref (y_w) - log pi/pi_ref (y_l)) of each pair, from the four
    log-probabilities (pairs,)."""
    return beta * ((chosen - ref_chosen) - (rejected - ref_rejected))


def dpo_loss(margins: Tensor) -> Tensor:
    """L_DPO of eq. 7 of each pair: -log sigmoid(margin)."""
    return -F.logsigmoid(margins)


@contextmanager
def lora_switched_off(model: nn.Module) -> Iterator[None]:
    """The model as it was before its LoRA adapters trained: each update scaled by zero."""
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    if any(layer.merged for layer in layers):
        raise AttnkitError(
            "the model's LoRA update is merged into its weights, so the reference model cannot "
            "be recovered from it; use DPO before merging"
        )
    scalings = [layer.scaling.clone() for layer in layers]
    try:
        for layer in layers:
            layer.scaling.zero_()
        yield
    finally:
        for layer, scaling in zip(layers, scalings, strict=True):
            layer.scaling.copy_(scaling)


class DPO(TrainingObjective):
    """The DPO loss of a policy against its reference, frozen when this is made.

    With LoRA adapters the reference is the model with the adapters switched off;
    otherwise a frozen copy of the model as it is now. As the Trainer's objective it
    returns the summed loss of a batch's pairs and their count (`LossTerms.tokens`
    counts pairs), so a step minimises the mean over the global batch's pairs.
    """

    task = "preference"

    def __init__(self, model: nn.Module, beta: float = 0.1) -> None:
        super().__init__()
        self.beta = DPOSection(beta).beta
        self.reference = None
        if not has_lora(model):
            self.reference = copy.deepcopy(unwrap(model)).eval().requires_grad_(False)

    @torch.no_grad()
    def reference_log_probs(self, model: nn.Module, batch: PreferenceBatch) -> Tensor:
        """log pi_ref of each row of `batch`."""
        if self.reference is not None:
            self.reference.to(batch.tgt.device)  # where the Trainer moved the policy
            return response_log_probs(self.reference, batch)
        plain = unwrap(model)  # no gradient here: no DDP nor compiled graph to go through
        training = plain.training
        plain.eval()  # the reference has no dropout
        try:
            with lora_switched_off(plain):
                return response_log_probs(plain, batch)
        finally:
            plain.train(training)

    def rewards(self, model: nn.Module, batch: PreferenceBatch) -> tuple[Tensor, Tensor]:
        """The implicit rewards beta log pi/pi_ref of the chosen and of the rejected responses
        (pairs,) each, with gradient through the policy."""
        # The reference first: switching LoRA off and on again changes the scaling that the
        # policy's pass would have saved for its backward.
        reference = self.reference_log_probs(model, batch)
        rewards = self.beta * (response_log_probs(model, batch) - reference)
        return rewards[: batch.pairs], rewards[batch.pairs :]

    def margins(self, model: nn.Module, batch: PreferenceBatch) -> Tensor:
        """Each pair's margin (`dpo_margins`), with gradient through the policy."""
        chosen, rejected = self.rewards(model, batch)
        return chosen - rejected

    def __call__(self, model: nn.Module, batch: PreferenceBatch) -> LossTerms:
        losses = dpo_loss(self.margins(model, batch))
        pairs = losses.new_tensor(float(batch.pairs))
        return with_router_loss(model, LossTerms(losses.sum(), losses.detach().sum(), pairs))


def preference_metric(dpo: DPO, batches: Iterable[PreferenceBatch], max_batches: int = 0) -> Metric:
    """The validation of a preference run over `batches` (its first `max_batches`; 0: all):

    val_loss         the mean L_DPO
    reward_margin    the mean margin, beta log-ratio of the chosen minus the rejected
    reward_accuracy  the share of pairs whose margin is positive (TRL's "accuracy")
    reward_chosen, reward_rejected   the mean implicit reward of each side
    """

    def metric(model: TransformerModel) -> dict[str, float]:
        chosen, rejected = [], []
        for i, batch in enumerate(batches):
            if max_batches and i >= max_batches:
                break
            good, bad = dpo.rewards(model, batch.to(model.device))
            chosen.append(good.double())
            rejected.append(bad.double())
        good, bad = torch.cat(chosen), torch.cat(rejected)
        margins = good - bad
        return {
            "val_loss": dpo_loss(margins).mean().item(),
            "reward_margin": margins.mean().item(),
            "reward_accuracy": (margins > 0).double().mean().item(),
            "reward_chosen": good.mean().item(),
            "reward_rejected": bad.mean().item(),
        }

    return metric
