"""A padded batch of token ids: the unit the trainer and the decoders consume.

The encoder reads `src` and the decoder reads `tgt`, whatever the shape: a
translation batch has both, a language-model batch only `tgt`, an encoder
batch only `src`. Masks are True for real tokens and False for padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Batch:
    src: Tensor | None = None
    src_mask: Tensor | None = None
    tgt: Tensor | None = None
    tgt_mask: Tensor | None = None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return Batch(move(self.src), move(self.src_mask), move(self.tgt), move(self.tgt_mask))

    def pin_memory(self) -> Batch:
        """Page-locked copies, so a copy to the GPU can overlap compute (DataLoader calls this)."""

        def pin(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.pin_memory()

        return Batch(pin(self.src), pin(self.src_mask), pin(self.tgt), pin(self.tgt_mask))

    @property
    def size(self) -> int:
        ids = self.tgt if self.tgt is not None else self.src
        return 0 if ids is None else ids.shape[0]


def pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Right-pad id lists into (batch, longest) ids and a True-for-real-token mask."""
    longest = max((len(s) for s in sequences), default=0)
    ids = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    return ids, torch.arange(longest)[None, :] < lengths[:, None]


def shift_targets(
    tgt: Tensor, tgt_mask: Tensor | None, ignore: int
) -> tuple[Tensor, Tensor | None, Tensor]:
    """Teacher forcing: the decoder input (all but the last token), its mask, and the next
    tokens to predict, `ignore` where they are padding (no mask: none is)."""
    targets = tgt[:, 1:]
    if tgt_mask is not None:
        targets = targets.masked_fill(~tgt_mask[:, 1:].bool(), ignore)
    return tgt[:, :-1], None if tgt_mask is None else tgt_mask[:, :-1], targets
