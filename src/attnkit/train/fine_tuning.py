"""The two sections that fine-tune a frozen model, [lora] and [adapters], and `fine_tune`,
which applies them.

Both usually come with `train.init_from` (the run whose model and tokenizer
start this one) and train a small set of numbers beside the frozen base:
LoRA's low-rank updates (`attnkit.nn.lora`) or Houlsby's bottleneck adapters
(`attnkit.nn.adapters`). A run takes one of them (`fine_tune` refuses both).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from attnkit.checks import check, finite_fields, non_negative, positive, within
from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel
from attnkit.nn.adapters import apply_adapters
from attnkit.nn.lora import ATTENTION_PROJECTIONS, apply_lora

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoraSection:
    """Low-rank adapters (`attnkit.nn.lora`) on a frozen model, usually with `train.init_from`.

    rank: r of each update B A; 0 (the default) trains the whole model, no adapters.
    alpha: the update is scaled by alpha / rank.
    dropout: on the adapters' input.
    targets: shell patterns over the names of the linear layers to adapt;
        the default is every attention projection.
    """

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ATTENTION_PROJECTIONS

    def __post_init__(self) -> None:
        finite_fields(self, "lora")
        non_negative("lora.rank", self.rank)
        positive("lora.alpha", self.alpha)
        within("lora.dropout", self.dropout, "[0, 1)")
        check(len(self.targets) > 0, "lora.targets must name at least one pattern")


@dataclass(frozen=True)
class AdaptersSection:
    """Houlsby adapters (`attnkit.nn.adapters`) in a frozen model, usually with `train.init_from`.

    size: the bottleneck m of each adapter; 0 (the default) adds none.
    """

    size: int = 0

    def __post_init__(self) -> None:
        non_negative("adapters.size", self.size)


def fine_tune(
    model: TransformerModel, lora: LoraSection, adapters: AdaptersSection, seed: int
) -> None:
    """Freeze `model` under the LoRA updates or the adapters the sections ask for (none: the
    whole model trains); LoRA's A matrices are drawn from `seed`."""
    if lora.rank and adapters.size:
        raise AttnkitError(
            "lora.rank and adapters.size both fine-tune a frozen model; choose one of them"
        )
    if lora.rank:
        # A is drawn at random; the seed makes it the same in every run (a run started from
        # train.init_from draws nothing else before it).
        torch.manual_seed(seed)
        names = apply_lora(model, lora.rank, lora.alpha, lora.dropout, lora.targets)
        log.info(
            "LoRA of rank %d on %d linear layers: %d of %d parameters train",
            lora.rank,
            len(names),
            model.num_parameters(trainable_only=True),
            model.num_parameters(),
        )
    if adapters.size:
        count = apply_adapters(model, adapters.size)
        log.info(
            "%d adapters of bottleneck %d: %d of %d parameters train",
            count,
            adapters.size,
            model.num_parameters(trainable_only=True),
            model.num_parameters(),
        )
