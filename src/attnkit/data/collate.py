"""Collation: examples of ids to one padded `Batch`, and how much of it is padding.

Each side is right-padded to its longest sequence in the batch, with a mask
that is True for real tokens. Padding efficiency is the share of real tokens
in the batch tensors, sum(mask) / mask.numel(), over every side present.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from attnkit.data.batch import Batch, pad


def collate_translation(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]], *, src_pad_id: int, tgt_pad_id: int
) -> Batch:
    """(source, target) pairs to `src, src_mask, tgt, tgt_mask`; targets keep their <s> and </s>."""
    src, src_mask = pad([s for s, _ in examples], src_pad_id)
    tgt, tgt_mask = pad([t for _, t in examples], tgt_pad_id)
    return Batch(src=src, src_mask=src_mask, tgt=tgt, tgt_mask=tgt_mask)


def collate_lm(examples: Sequence[Sequence[int]], *, pad_id: int) -> Batch:
    """Blocks of block_size + 1 ids to `tgt, tgt_mask`; inputs tgt[:, :-1], labels tgt[:, 1:].

    Blocks of one length need no padding, and then `tgt_mask` is None: the model
    takes the positions as a slice of its table and the plain causal mask, not
    the per-sequence positions and masks of a padded batch (4% of a training step
    of the Tiny Shakespeare recipe).
    """
    tgt, tgt_mask = pad(examples, pad_id)
    return Batch(tgt=tgt, tgt_mask=None if bool(tgt_mask.all()) else tgt_mask)


def collate_encoder(examples: Sequence[Sequence[int]], *, pad_id: int) -> Batch:
    """Sentences to `src, src_mask`, the input of an encoder-only model."""
    src, src_mask = pad(examples, pad_id)
    return Batch(src=src, src_mask=src_mask)


def padding_efficiency(batches: Iterable[Batch]) -> float:
    """Real tokens / all tokens over the id tensors of these batches (1.0 is no padding)."""
    real = total = 0
    for batch in batches:
        for mask in (batch.src_mask, batch.tgt_mask):
            if mask is not None:
                real += int(mask.sum())
                total += mask.numel()
    return real / total if total else 1.0
