"""The two sections that fine-tune a frozen model: [lora] and [adapters].

Both usually come with `train.init_from` (the run whose model and tokenizer
start this one) and train a small set of numbers beside the frozen base:
LoRA's low-rank updates (`attnkit.nn.lora`) or Houlsby's bottleneck adapters
(`attnkit.nn.adapters`). A run takes one of them (`train.tasks` refuses both).
"""

from __future__ import annotations

from dataclasses import dataclass

from attnkit.checks import check, finite_fields, non_negative, positive, within
from attnkit.nn.lora import ATTENTION_PROJECTIONS


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
