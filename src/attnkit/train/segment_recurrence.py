"""Training a language model with segment recurrence (Transformer-XL): the [segment_recurrence]
section and its objective.

Each training block of `data.block_size` tokens is read `segment` tokens at a time, each
segment attending to the stop-gradient memory of the one before at every layer
(`attnkit.models.segment_memory`, which says how, and why its positions are RoPE's); the loss
is the next-token cross-entropy of every position, as without it. Validation reads its blocks
the same way. The memory is carried within a block, not from one batch to the next (the
blocks of a batch are drawn apart); a block of k segments trains the reach of k segments.

    [segment_recurrence]
    segment = 32      # tokens a segment; 0 (the default) reads each block whole
    mem_len = 0       # positions of memory kept a layer; 0 is one segment
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnkit.checks import check, finite_fields, non_negative
from attnkit.errors import AttnkitError
from attnkit.models.base import unwrap
from attnkit.models.segment_memory import check_recurrent, forward_segment
from attnkit.train.objectives import LanguageModelObjective


@dataclass(frozen=True)
class SegmentRecurrenceSection:
    """The [segment_recurrence] section of a run config (a language model's).

    segment: tokens a segment, each attending to the memory of the one before; 0 is off.
    mem_len: positions of memory kept at each layer; 0 is one segment.
    """

    segment: int = 0
    mem_len: int = 0

    def __post_init__(self) -> None:
        s = "segment_recurrence"
        finite_fields(self, s)
        non_negative(f"{s}.segment", self.segment)
        non_negative(f"{s}.mem_len", self.mem_len)
        check(
            self.segment or not self.mem_len,
            f"{s}.mem_len is the memory of segment recurrence; set {s}.segment too",
        )

    @property
    def on(self) -> bool:
        return self.segment > 0


class SegmentRecurrenceObjective(LanguageModelObjective):
    """Next-token prediction over blocks read a segment at a time, each after the memory of the
    one before (`models/segment_memory.py`)."""

    one_forward = False  # a forward pass a segment: DistributedDataParallel syncs one

    def __init__(self, section: SegmentRecurrenceSection, label_smoothing: float = 0.0) -> None:
        super().__init__(label_smoothing)
        self.segment = section.segment
        self.mem_len = section.mem_len or section.segment

    def check(self, model: nn.Module) -> None:
        """Refuse, before training, a model that cannot carry a memory or hold one."""
        plain = unwrap(model)
        check_recurrent(plain)
        if self.segment + self.mem_len > plain.config.max_len:
            raise AttnkitError(
                f"segment_recurrence.segment {self.segment} and its memory of {self.mem_len} "
                f"exceed model.max_len {plain.config.max_len}; lower them or raise max_len"
            )

    def run(
        self,
        model: nn.Module,
        batch,
        dec_in: Tensor,
        dec_mask: Tensor | None,
        repeat: int = 1,
    ) -> Tensor:
        if dec_mask is not None and not bool(dec_mask.all()):
            raise AttnkitError(
                "segment recurrence reads whole blocks of text; this batch holds padding"
            )
        plain, memory, hidden = unwrap(model), None, []
        for start in range(0, dec_in.shape[1], self.segment):
            ids = dec_in[:, start : start + self.segment]
            out, memory = forward_segment(plain, ids, memory, self.mem_len, need_logits=False)
            hidden.append(out.hidden)
        return torch.cat(hidden, dim=1)


def recurrent_objective(config: Any, model: nn.Module) -> SegmentRecurrenceObjective:
    """The objective of a run whose `config` (a `RunConfig`, which imports this module) has
    [segment_recurrence]; refused for a task other than a language model's, beside the other
    objectives, or for a model that cannot carry the memory."""
    others = config.scheduled_sampling.on or config.sequence_loss.on or config.guided_attention.on
    if config.data.task != "language-model" or others:
        raise AttnkitError(
            "[segment_recurrence] reads a language model's blocks a segment at a time; use it "
            "with data.task 'language-model' and without [scheduled_sampling], [sequence_loss] "
            "or [guided_attention]"
        )
    objective = SegmentRecurrenceObjective(config.segment_recurrence, config.train.label_smoothing)
    objective.check(model)
    return objective
