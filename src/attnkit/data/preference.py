"""Preference pairs: a prompt x, the response a person preferred, y_w, and the one they did
not, y_l; read from JSON lines, encoded, and batched for direct preference optimisation
(`attnkit.train.preference`).

A file holds one JSON object a line with the string fields TRL names `prompt`,
`chosen` and `rejected`:

    {"prompt": "Name a colour.", "chosen": "Blue.", "rejected": "Seven."}

A batch holds each pair twice, the n chosen rows then the n rejected rows, so
that the policy scores both in one forward pass. For a decoder-only model a
row is the prompt followed by the response, and only the response's tokens are
scored. For an encoder-decoder the prompt is the encoder's source (ending in
</s>, as a translation's source does) and a row is the decoder's sequence,
<s> y_1 .. y_n </s>, as teacher forcing reads a translation's target: the
decoder reads all of it but the last token and predicts all of it but the first.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from attnkit.checks import token_ids
from attnkit.config import ModelConfig
from attnkit.data.batch import Batch, pad
from attnkit.errors import AttnkitError
from attnkit.files import read_lines
from attnkit.tokenizer import Tokenizer

log = logging.getLogger(__name__)

FIELDS = ("prompt", "chosen", "rejected")

Ids = Sequence[int]


@dataclass(frozen=True)
class PreferencePair:
    """One line of a preference file: the prompt and its chosen and rejected responses."""

    prompt: str
    chosen: str
    rejected: str


def read_pairs(path: str | Path) -> list[PreferencePair]:
    """The pairs of a JSON-lines file; a line that is not an object with the three non-empty
    string fields stops the reading, in one sentence naming the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise AttnkitError(
            f"{path} is missing; a preference corpus is a folder holding "
            "{split}.jsonl files of prompt, chosen and rejected"
        )
    pairs = []
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise AttnkitError(f"{where} is not valid JSON: {err.msg}") from None
        if not isinstance(row, dict):
            raise AttnkitError(
                f"{where} holds {type(row).__name__}, not an object with {', '.join(FIELDS)}"
            )
        for field in FIELDS:
            value = row.get(field)
            if not isinstance(value, str):
                problem = "has no" if value is None else "has a non-string"
                raise AttnkitError(
                    f"{where} {problem} {field!r}; each pair needs the string fields "
                    f"{', '.join(FIELDS)}"
                )
            if not value.strip():
                raise AttnkitError(f"{where} has an empty {field!r}; every field needs text")
        pairs.append(PreferencePair(row["prompt"], row["chosen"], row["rejected"]))
    if not pairs:
        raise AttnkitError(f"{path} holds no preference pairs; write one JSON object a line")
    return pairs


@dataclass
class PreferenceBatch(Batch):
    """2n rows: the n pairs with their chosen responses, then with their rejected ones.

    `tgt` holds what the decoder reads (prompt and response for a decoder-only
    model, <s> response </s> for an encoder-decoder, whose prompts are `src`);
    `scored` is True at the tokens of `tgt` whose log-probability counts, the
    response's.
    """

    scored: Tensor | None = None

    def __post_init__(self) -> None:
        """Pairs are checked, not inferred: an even number of rows, row i and row n + i with
        one prompt. A batch of 3 rows would otherwise be read as one pair and a stray row,
        and a chosen response scored as a rejected one."""
        rows = self.tgt.shape[0]
        if self.scored is None or self.scored.shape != self.tgt.shape:
            raise AttnkitError(
                "a preference batch needs `scored`, True at the response tokens, the shape of "
                "its tgt; make one with preference_batch"
            )
        if rows == 0 or rows % 2:
            raise AttnkitError(
                f"a preference batch holds n chosen rows, then the n rejected rows of the same "
                f"prompts, so an even number of rows, not {rows}; make one with preference_batch"
            )
        if self.tgt.device.type == "cpu":  # where batches are made; a move keeps the rows
            n = rows // 2
            if self.src is not None:
                prompts = torch.where(self.src_mask.bool(), self.src, -1)
            else:
                prompts = torch.where(self.tgt_mask.bool() & ~self.scored, self.tgt, -1)
            differ = (prompts[:n] != prompts[n:]).any(-1).nonzero().flatten()
            if len(differ):
                i = int(differ[0])
                raise AttnkitError(
                    f"rows {i} and {n + i} of this preference batch are no pair: their prompts "
                    "differ; a batch holds n chosen rows, then the n rejected rows of the same "
                    "prompts in the same order (preference_batch makes one)"
                )

    @property
    def pairs(self) -> int:
        return self.tgt.shape[0] // 2

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PreferenceBatch:
        moved = super().to(device, non_blocking)
        scored = self.scored.to(device, non_blocking=non_blocking)
        return PreferenceBatch(moved.src, moved.src_mask, moved.tgt, moved.tgt_mask, scored)

    def pin_memory(self) -> PreferenceBatch:
        pinned = super().pin_memory()
        return PreferenceBatch(
            pinned.src, pinned.src_mask, pinned.tgt, pinned.tgt_mask, self.scored.pin_memory()
        )


def preference_batch(
    pairs: Sequence[tuple[Ids, Ids, Ids]], pad_id: int, decoder_start_id: int | None = None
) -> PreferenceBatch:
    """(prompt, chosen, rejected) id lists -> a `PreferenceBatch`: for a decoder-only model
    without `decoder_start_id`, for an encoder-decoder with it (each response then ends with
    its </s>, and the prompt, the source, with its own)."""
    if not pairs:
        raise AttnkitError("a preference batch needs at least one (prompt, chosen, rejected)")
    checked = []
    for at, pair in enumerate(pairs):
        if len(pair) != 3:
            raise AttnkitError(
                f"preference pair {at} has {len(pair)} parts, not (prompt, chosen, rejected)"
            )
        prompt, chosen, rejected = (
            token_ids(f"pair {at}'s {side}", ids)
            for side, ids in zip(("prompt", "chosen", "rejected"), pair, strict=True)
        )
        if not prompt or not chosen or not rejected:
            raise AttnkitError(
                "every preference pair needs a prompt, a chosen and a rejected response"
            )
        checked.append((prompt, chosen, rejected))
    pairs = checked
    responses = [pair[1] for pair in pairs] + [pair[2] for pair in pairs]
    prompts = [pair[0] for pair in pairs] * 2
    if decoder_start_id is None:
        tgt, mask = pad([[*p, *r] for p, r in zip(prompts, responses, strict=True)], pad_id)
        starts = torch.tensor([len(p) for p in prompts])[:, None]
        scored = mask & (torch.arange(tgt.shape[1]) >= starts)
        return PreferenceBatch(tgt=tgt, tgt_mask=mask, scored=scored)
    src, src_mask = pad(prompts, pad_id)
    tgt, mask = pad([[decoder_start_id, *r] for r in responses], pad_id)
    scored = mask.clone()
    scored[:, 0] = False  # the start token is read, never predicted
    return PreferenceBatch(src, src_mask, tgt, mask, scored)


class PreferenceDataset(Dataset):
    """Preference pairs as ids, for a decoder-only model or, with `decoder_start_id`, an
    encoder-decoder (`preference_batch`).

    max_len: the most ids of a decoder row (prompt and response, or <s> response </s>) and of
        a source; longer pairs are skipped and counted.
    """

    def __init__(
        self,
        pairs: Sequence[PreferencePair],
        tokenizer: Tokenizer,
        *,
        decoder_start_id: int | None = None,
        max_len: int,
        name: str,
    ) -> None:
        encoder_decoder = decoder_start_id is not None
        # An encoder-decoder's source and responses end in </s>, as translation's do; a
        # language model's response continues its prompt, as its running text did.
        prompts, chosen, rejected = (
            tokenizer.encode_batch(
                [getattr(pair, field) for pair in pairs], add_eos=encoder_decoder
            )
            for field in FIELDS
        )
        self.examples = []
        rows = []
        for p, c, r in zip(prompts, chosen, rejected, strict=True):
            # The ids of each side of the batch: the sources and the two responses' rows.
            if encoder_decoder:
                sides = (len(p), len(c) + 1, len(r) + 1)
            else:
                sides = (len(p) + len(c), len(p) + len(r))
            if max(sides) <= max_len:
                self.examples.append((p, c, r))
                rows.append(sides)
        skipped = len(pairs) - len(self.examples)
        if not self.examples:
            raise AttnkitError(
                f"every pair of {name} is longer than max_len {max_len} ids; raise data.max_len "
                "(within the model's max_len) or shorten the pairs"
            )
        if skipped:
            log.warning(
                "%s: kept %d pairs, skipped %d longer than %d ids",
                name,
                len(self.examples),
                skipped,
                max_len,
            )
        self.lengths = np.array(rows, dtype=np.int64)
        """Ids per side of each pair (pairs, sides): what `TokenBudgetSampler` batches by."""
        self.collate = partial(
            preference_batch, pad_id=tokenizer.pad_id, decoder_start_id=decoder_start_id
        )
        """`collate_fn` for a DataLoader: pairs to a `PreferenceBatch`."""

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> tuple[Ids, Ids, Ids]:
        return self.examples[index]


def preference_splits(
    folder: str | Path,
    splits: Sequence[str],
    tokenizer: Tokenizer,
    model: ModelConfig,
    max_len: int,
) -> list[PreferenceDataset]:
    """The pairs of `folder`'s `{split}.jsonl` for each split, as ids for `model`: an
    encoder-decoder reads each prompt as its source and each response after its start id."""
    start = model.decoder_start_id if model.shape == "encoder-decoder" else None
    return [
        PreferenceDataset(
            read_pairs(Path(folder) / f"{split}.jsonl"),
            tokenizer,
            decoder_start_id=start,
            max_len=min(max_len, model.max_len),
            name=f"{split}.jsonl",
        )
        for split in splits
    ]
