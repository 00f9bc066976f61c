"""Training a language model with segment recurrence (Transformer-XL): the [segment_recurrence]
section and its objective.

Each training block of `data.block_size` tokens is read `segment` tokens at a time, each
segment attending to the stop-gradient memory of the one before at every layer
(`attnkit.models.segment_memory`, which says how, and why its positions are RoPE's); the loss
is the next-token cross-entropy of every position, as without it. Validation reads its blocks
the same way. Where the memory goes after a block is `carry`'s:

- `block` (the default): the memory is carried within a block only, each batch starting
  without one (the blocks of a batch are drawn apart); a block of k segments trains the reach
  of k segments.
- `stream` (Transformer-XL's training): the text is cut into `data.batch_size` (times the
  ranks) contiguous streams, row j of every batch reading stream j's next block
  (`StreamBlocks`, as the paper's `batchify`), and the memory the last segment of batch t
  leaves is what the first segment of batch t + 1 attends to, a constant of that step (the
  gradient stops at it, so batch t's graph is not kept). A pass over the text starts without
  a memory; so does the first batch of a resumed run (a memory is not saved) and every
  validation, which reads its own streams with a memory of its own.

    [segment_recurrence]
    segment = 32      # tokens a segment; 0 (the default) reads each block whole
    mem_len = 0       # positions of memory kept a layer; 0 is one segment
    carry = "block"   # or "stream": the memory goes on to the next batch
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from attnkit.checks import check, choice, finite_fields, non_negative
from attnkit.data.batch import Batch
from attnkit.errors import AttnkitError
from attnkit.models.base import unwrap
from attnkit.models.segment_memory import Memory, check_recurrent, forward_segment
from attnkit.train.objectives import LanguageModelObjective


@dataclass(frozen=True)
class SegmentRecurrenceSection:
    """The [segment_recurrence] section of a run config (a language model's).

    segment: tokens a segment, each attending to the memory of the one before; 0 is off.
    mem_len: positions of memory kept at each layer; 0 is one segment.

    carry: `block`: each batch starts without a memory; `stream`: the text is read as
        data.batch_size contiguous streams, and each batch starts with the memory the one
        before left (Transformer-XL).
    """

    segment: int = 0
    mem_len: int = 0
    carry: str = "block"

    def __post_init__(self) -> None:
        s = "segment_recurrence"
        finite_fields(self, s)
        non_negative(f"{s}.segment", self.segment)
        non_negative(f"{s}.mem_len", self.mem_len)
        choice(f"{s}.carry", self.carry, CARRIES)
        check(
            self.segment or not self.mem_len,
            f"{s}.mem_len is the memory of segment recurrence; set {s}.segment too",
        )
        check(
            self.segment or self.carry == "block",
            f"{s}.carry is where segment recurrence's memory goes; set {s}.segment too",
        )

    @property
    def on(self) -> bool:
        return self.segment > 0


CARRIES = ("block", "stream")


class SegmentRecurrenceObjective(LanguageModelObjective):
    """Next-token prediction over blocks read a segment at a time, each after the memory of the
    one before (`models/segment_memory.py`)."""

    one_forward = False  # a forward pass a segment: DistributedDataParallel syncs one

    def __init__(self, section: SegmentRecurrenceSection, label_smoothing: float = 0.0) -> None:
        super().__init__(label_smoothing)
        self.segment = section.segment
        self.mem_len = section.mem_len or section.segment
        self.carry = section.carry == "stream"
        # The memory the last batch left, one for training and one for validation (by the
        # model's mode), so that a validation between two steps leaves training's untouched.
        self.memories: dict[bool, Memory] = {}

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
        plain, hidden = unwrap(model), []
        memory = self.carried(plain.training, batch, dec_in.shape[0])
        for start in range(0, dec_in.shape[1], self.segment):
            ids = dec_in[:, start : start + self.segment]
            out, memory = forward_segment(plain, ids, memory, self.mem_len, need_logits=False)
            hidden.append(out.hidden)
        if self.carry:
            self.memories[plain.training] = memory  # detached: batch t's graph is let go
        return torch.cat(hidden, dim=1)

    def carried(self, training: bool, batch: Any, rows: int) -> Memory | None:
        """The memory the batch before left, if it reads on from it: carrying, not the first
        of its streams (a `StreamBatch`'s `first`), and of as many rows."""
        memory = self.memories.get(training)
        if not self.carry or getattr(batch, "first", True) or memory is None:
            return None
        return memory if memory[0].shape[0] == rows else None


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
    if config.segment_recurrence.carry == "stream" and config.data.windows != "blocks":
        raise AttnkitError(
            "segment_recurrence.carry 'stream' reads the text's blocks in order, each row after "
            f"its own previous one; set data.windows = 'blocks' (not {config.data.windows!r})"
        )
    objective = SegmentRecurrenceObjective(config.segment_recurrence, config.train.label_smoothing)
    objective.check(model)
    return objective


# -- the streams: consecutive blocks of the same text in the same rows --------------------------


@dataclass
class StreamBatch(Batch):
    """A batch of blocks that continue the blocks of the batch before, row by row; `first`:
    the streams begin here (no memory before it)."""

    first: bool = False

    def to(self, device: torch.device | str, non_blocking: bool = False) -> StreamBatch:
        moved = super().to(device, non_blocking)
        return StreamBatch(moved.src, moved.src_mask, moved.tgt, moved.tgt_mask, self.first)

    def pin_memory(self) -> StreamBatch:
        pinned = super().pin_memory()
        return StreamBatch(pinned.src, pinned.src_mask, pinned.tgt, pinned.tgt_mask, self.first)


class StreamBlocks(Dataset):
    """A language model's blocks (a `LanguageModelDataset` on its fixed grid) read as `rows`
    streams a rank: the blocks cut into rows x world_size contiguous streams of `per_stream`
    blocks, batch t giving row j of rank r the t-th block of stream r * rows + j (the blocks
    left over at the end are not read). Its batch sampler is `batches()`."""

    one_shape = True

    def __init__(self, blocks: Any, rows: int, rank: int = 0, world_size: int = 1) -> None:
        self.blocks, self.rows, self.rank = blocks, rows, rank
        self.per_stream = len(blocks) // (rows * world_size)
        if self.per_stream == 0:
            raise AttnkitError(
                f"segment_recurrence.carry 'stream' reads the text as data.batch_size x ranks = "
                f"{rows * world_size} streams, but a split has {len(blocks)} blocks; lower "
                "data.batch_size or data.block_size, or give more text (for the validation "
                "split, a larger data.valid_fraction)"
            )
        self.lengths = blocks.lengths
        self.inner_collate = blocks.collate

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> tuple[int, Any]:
        return index, self.blocks[index]

    def batches(self) -> list[list[int]]:
        """The block indices of each batch, in reading order."""
        streams = [(self.rank * self.rows + j) * self.per_stream for j in range(self.rows)]
        return [[start + t for start in streams] for t in range(self.per_stream)]

    def collate(self, examples: list[tuple[int, Any]]) -> StreamBatch:
        """The blocks as a `Batch`, marked `first` where they begin their streams."""
        batch = self.inner_collate([block for _, block in examples])
        first = examples[0][0] % self.per_stream == 0
        return StreamBatch(batch.src, batch.src_mask, batch.tgt, batch.tgt_mask, first)
