"""Direct preference optimisation (Rafailov et al. 2023, "Direct Preference Optimization: Your
Language Model is Secretly a Reward Model"): preference tuning without a reward model.

Given a prompt x, a response a person preferred, y_w, and one they did not, y_l,
DPO raises the policy's likelihood of y_w relative to a frozen reference model
and lowers that of y_l (eq. 7):

    L_DPO = -log sigmoid( beta log pi(y_w|x)/pi_ref(y_w|x) - beta log pi(y_l|x)/pi_ref(y_l|x) )

where log pi(y|x) is the sum of the log-probabilities of y's tokens after x.
beta log pi/pi_ref is the "implicit reward" of a response; the chosen-minus-
rejected difference of the two is the margin, which training pushes up.

The reference is the run being fine-tuned, frozen at the start: a copy of it,
or, when the model trains through LoRA adapters (`nn/lora.py`), the same model
with the adapters' update switched off, which costs no second copy.

This module is for decoder-only language models (prompt and response in one
sequence, as TRL, torchtune and litgpt train them); `PreferenceBatch` holds the
two sequences of each pair and which of their tokens are the response's.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.data.batch import pad
from attnkit.errors import AttnkitError
from attnkit.nn.lora import LoRALinear, has_lora


@dataclass
class ScoredSequences:
    """Prompt-and-response sequences (batch, length), right-padded: `mask` True for real
    tokens, `scored` True for the response's tokens (those whose log-probability counts)."""

    ids: Tensor
    mask: Tensor
    scored: Tensor


@dataclass
class PreferenceBatch:
    """Each row's prompt with its chosen response, and with its rejected one."""

    chosen: ScoredSequences
    rejected: ScoredSequences


def preference_batch(
    pairs: Sequence[tuple[Sequence[int], Sequence[int], Sequence[int]]], pad_id: int
) -> PreferenceBatch:
    """(prompt, chosen, rejected) id lists -> a `PreferenceBatch`."""
    if not pairs:
        raise AttnkitError("a preference batch needs at least one (prompt, chosen, rejected)")

    def side(index: int) -> ScoredSequences:
        rows = [list(pair[0]) + list(pair[index]) for pair in pairs]
        ids, mask = pad(rows, pad_id)
        starts = torch.tensor([len(pair[0]) for pair in pairs])[:, None]
        return ScoredSequences(ids, mask, mask & (torch.arange(ids.shape[1]) >= starts))

    for prompt, chosen, rejected in pairs:
        if not prompt or not chosen or not rejected:
            raise AttnkitError(
                "every preference pair needs a prompt, a chosen and a rejected response"
            )
    return PreferenceBatch(side(1), side(2))


def response_log_probs(model: nn.Module, seqs: ScoredSequences) -> Tensor:
    """log pi(y|x) (batch,): the sum of the log-probabilities of the scored tokens, each
    predicted from the tokens before it."""
    logits = model(seqs.ids, seqs.mask).logits[:, :-1].float()
    targets = seqs.ids[:, 1:]
    token = logits.log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)
    return (token * seqs.scored[:, 1:]).sum(-1)


def dpo_loss(
    chosen: Tensor, rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor, beta: float
) -> tuple[Tensor, Tensor]:
    """The mean L_DPO of eq. 7 over a batch, from the four log-probabilities (batch,), and the
    margins beta (log pi/pi_ref (y_w) - log pi/pi_ref (y_l)) (batch,)."""
    margins = beta * ((chosen - ref_chosen) - (rejected - ref_rejected))
    return -F.logsigmoid(margins).mean(), margins


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


class DPO:
    """The DPO loss of a policy against its reference, frozen when this is made.

    With LoRA adapters the reference is the model with the adapters switched off;
    otherwise a frozen copy of the model as it is now.
    """

    def __init__(self, model: nn.Module, beta: float = 0.1) -> None:
        if not beta > 0:
            raise AttnkitError(f"DPO's beta must be positive, got {beta!r}")
        self.beta = beta
        self.reference = None
        if not has_lora(model):
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)

    @torch.no_grad()
    def reference_log_probs(
        self, model: nn.Module, batch: PreferenceBatch
    ) -> tuple[Tensor, Tensor]:
        """log pi_ref of the chosen and the rejected responses."""
        if self.reference is not None:
            return (
                response_log_probs(self.reference, batch.chosen),
                response_log_probs(self.reference, batch.rejected),
            )
        training = model.training
        model.eval()  # the reference has no dropout
        try:
            with lora_switched_off(model):
                return (
                    response_log_probs(model, batch.chosen),
                    response_log_probs(model, batch.rejected),
                )
        finally:
            model.train(training)

    def __call__(self, model: nn.Module, batch: PreferenceBatch) -> tuple[Tensor, Tensor]:
        """The mean loss over the batch (with gradient) and each pair's margin."""
        ref_chosen, ref_rejected = self.reference_log_probs(model, batch)
        chosen = response_log_probs(model, batch.chosen)
        rejected = response_log_probs(model, batch.rejected)
        return dpo_loss(chosen, rejected, ref_chosen, ref_rejected, self.beta)
