"""Datasets: text encoded once into ids (over 400 lines: three kinds over one packed encoding).

For translation, encoders and language models.

- `ParallelDataset`: sentence pairs; the source ends with </s>, the target is
  <s> ... </s> (the trainer feeds tgt[:, :-1] and predicts tgt[:, 1:]).
- `SentenceDataset`: single sentences as <s> ... </s> ([CLS] ... [SEP] with a
  BERT vocabulary), for encoder-only models.
- `LanguageModelDataset`: the text as one token stream read in windows of
  block_size + 1 tokens; the last `val_fraction` of the stream is the `val`
  split. Validation reads fixed blocks that overlap by one, so every token but
  the first is a label once. Training reads, each epoch, as many windows as the
  stream has blocks, at offsets drawn afresh (`WINDOWS`), so that a long run
  does not see the same few thousand windows again and again.

Sentences that are empty or longer than `max_len` ids are skipped, counted in
`skipped` and logged; none is cut silently. Ids are stored packed in one flat
array per side, so a corpus of millions of sentences stays small in memory.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from attnkit.checks import choice, within
from attnkit.data import extended
from attnkit.data.collate import collate_encoder, collate_lm, collate_translation
from attnkit.data.text import read_parallel
from attnkit.errors import AttnkitError
from attnkit.files import PathLike, read_lines
from attnkit.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# Sentences are encoded this many at a time: large enough for the Rust
# backend to use every core, small enough to bound the memory of a big corpus.
CHUNK = 8192
# The characters of one string encoded: 64 lines of 64 characters. Tokenizers' encodings cost
# hundreds of bytes a token, so pieces and calls are bounded by characters too, not only lines.
PIECE_CHARS = 4096


def _pack(chunk: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """One chunk of id lists as (flat ids, lengths)."""
    flat = np.fromiter(itertools.chain.from_iterable(chunk), dtype=np.int32)
    return flat, np.fromiter(map(len, chunk), dtype=np.int64, count=len(chunk))


def _end_to_end(arrays: list[np.ndarray], dtype: type) -> np.ndarray:
    """The arrays of `arrays` end to end, each freed (taken off the list) once copied: the
    memory this takes at its peak is the result and one array, not twice the result."""
    out = np.empty(sum(map(len, arrays)), dtype=dtype)
    at = 0
    arrays.reverse()
    while arrays:
        part = arrays.pop()
        out[at : at + len(part)] = part
        at += len(part)
    return out


class _Packed:
    """Many id sequences in one flat int32 array plus offsets, built from packed chunks."""

    def __init__(self, parts: Iterable[tuple[np.ndarray, np.ndarray]]) -> None:
        ids: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        for chunk_ids, chunk_lengths in parts:
            ids.append(chunk_ids)
            lengths.append(chunk_lengths)
        self.ids = _end_to_end(ids, np.int32)
        self.lengths = _end_to_end(lengths, np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)])

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.ids[self.offsets[index] : self.offsets[index + 1]]


Encoder = Callable[[list[str]], list[list[int]]]
# Rows of aligned texts -> one list of id lists per side.
RowsEncoder = Callable[[list[tuple[str, ...]]], list[list[list[int]]]]


def per_side(*encoders: Encoder) -> RowsEncoder:
    """A rows encoder that encodes each side on its own, side i by `encoders[i]`."""
    return lambda rows: [encode([row[i] for row in rows]) for i, encode in enumerate(encoders)]


class _SentencesDataset(Dataset):
    """Rows of one or more aligned sentences, encoded side by side and filtered together."""

    def __init__(
        self,
        rows: Iterable[tuple[str, ...]],
        encode: RowsEncoder,
        n_sides: int,
        max_len: int | None,
        name: str,
    ) -> None:
        self.skipped = {"empty": 0, "too_long": 0}
        # Each chunk is packed as soon as it is encoded, so the peak memory is
        # the packed corpus plus one chunk of Python lists.
        kept: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(n_sides)]
        rows = iter(rows)
        while chunk := list(itertools.islice(rows, CHUNK)):
            full = [row for row in chunk if all(text.strip() for text in row)]
            self.skipped["empty"] += len(chunk) - len(full)
            sides = encode(full)
            keep = [
                max_len is None or all(len(side[j]) <= max_len for side in sides)
                for j in range(len(full))
            ]
            self.skipped["too_long"] += keep.count(False)
            for side, out in zip(sides, kept, strict=True):
                out.append(_pack(list(itertools.compress(side, keep))))
        self.sides = [_Packed(chunks) for chunks in kept]
        if len(self) == 0:
            raise AttnkitError(
                f"{name} has no usable sentences ({self.skipped['empty']} empty, "
                f"{self.skipped['too_long']} over max_len {max_len}); "
                "check the file or raise max_len"
            )
        if any(self.skipped.values()):
            logger.warning(
                "%s: kept %d, skipped %d empty and %d longer than max_len %s",
                name,
                len(self),
                self.skipped["empty"],
                self.skipped["too_long"],
                max_len,
            )

    def __len__(self) -> int:
        return len(self.sides[0])

    @property
    def lengths(self) -> np.ndarray:
        """Ids per example, shape (examples, sides): what `TokenBudgetSampler` batches by."""
        return np.stack([side.lengths for side in self.sides], axis=1)


class ParallelDataset(_SentencesDataset):
    """Sentence pairs as ids; example i is (source ids ending in </s>, target ids <s> ... </s>).

    tokenizer: the source tokenizer, and the target one too unless
        `tgt_tokenizer` is given (one joint vocabulary, as in the paper).
    max_len: the most ids a side may have; longer pairs are skipped and counted.
    copy: ids in a pointer-generator's extended vocabulary (`data/extended.py`): the
        source's unknown words as V + i, in its target too; needs one joint tokenizer.
    """

    def __init__(
        self,
        pairs: Iterable[tuple[str, str]],
        tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer | None = None,
        *,
        max_len: int | None = None,
        name: str = "parallel text",
        copy: bool = False,
    ) -> None:
        tgt_tokenizer = tgt_tokenizer or tokenizer
        if copy and tgt_tokenizer is not tokenizer:
            raise AttnkitError(
                "copying source words into the target needs one tokenizer for both sides"
            )
        encode = per_side(
            partial(tokenizer.encode_batch, add_eos=True),
            partial(tgt_tokenizer.encode_batch, add_bos=True, add_eos=True),
        )
        if copy:

            def encode(rows: list[tuple[str, ...]]) -> list[list[list[int]]]:
                return extended.encode_pairs(tokenizer, [r[0] for r in rows], [r[1] for r in rows])

        super().__init__(pairs, encode, 2, max_len, name)
        self.collate = partial(
            collate_translation, src_pad_id=tokenizer.pad_id, tgt_pad_id=tgt_tokenizer.pad_id
        )
        """`collate_fn` for a DataLoader: examples to a `Batch`."""

    @classmethod
    def from_files(
        cls,
        src_path: PathLike,
        tgt_path: PathLike | None = None,
        *,
        tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer | None = None,
        max_len: int | None = None,
    ) -> ParallelDataset:
        """Pairs from two aligned files, or from one `.tsv`/`.jsonl` file of pairs."""
        name = f"{src_path} + {tgt_path}" if tgt_path is not None else str(src_path)
        pairs = read_parallel(src_path, tgt_path)
        return cls(pairs, tokenizer, tgt_tokenizer, max_len=max_len, name=name)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return self.sides[0][index], self.sides[1][index]


class SentenceDataset(_SentencesDataset):
    """Single sentences as <s> ... </s> ids, one a line, for encoder-only models."""

    def __init__(
        self,
        sentences: Iterable[str],
        tokenizer: Tokenizer,
        *,
        max_len: int | None = None,
        name: str = "sentences",
    ) -> None:
        encode = per_side(partial(tokenizer.encode_batch, add_bos=True, add_eos=True))
        super().__init__(((s,) for s in sentences), encode, 1, max_len, name)
        self.collate = partial(collate_encoder, pad_id=tokenizer.pad_id)
        """`collate_fn` for a DataLoader: examples to a `Batch`."""

    @classmethod
    def from_file(
        cls, path: PathLike, *, tokenizer: Tokenizer, max_len: int | None = None
    ) -> SentenceDataset:
        return cls(read_lines(path), tokenizer, max_len=max_len, name=str(path))

    def __getitem__(self, index: int) -> np.ndarray:
        return self.sides[0][index]


SPLITS = ("train", "val")
# How training windows are placed each epoch (the epoch has (n - 1) // B windows either way):
#   random   every window at its own offset, uniform over the stream (nanoGPT's get_batch)
#   shifted  the block grid moved by one random offset in [0, B) for the whole epoch
#   blocks   the same fixed blocks every epoch, in a new order (validation reads these)
WINDOWS = ("random", "shifted", "blocks")


class LanguageModelDataset(Dataset):
    """A token stream read in windows of B + 1 tokens: example i of an epoch is
    stream[s_i : s_i + B + 1], B = block_size, with s_i = i * B for fixed blocks, or drawn
    by `windows` from a generator seeded by (seed, epoch) (`set_epoch` picks the epoch).

    The offsets depend only on (seed, epoch), so a run resumed at any step reads the
    same windows it would have read, and every rank of a DDP run draws the same
    epoch and takes its own share of it.
    """

    one_shape = True  # every example has B + 1 tokens (what CUDA graphs need to replay)

    def __init__(
        self,
        stream: Sequence[int] | np.ndarray,
        block_size: int,
        *,
        pad_id: int,
        windows: str = "blocks",
        seed: int = 0,
    ) -> None:
        if block_size < 1:
            raise AttnkitError(f"block_size must be a positive integer, got {block_size}")
        choice("windows", windows, WINDOWS)
        self.stream = np.asarray(stream, dtype=np.int32)
        self.block_size = block_size
        self.windows, self.seed = windows, seed
        if len(self) == 0:
            raise AttnkitError(
                f"the token stream has {len(self.stream)} tokens, too few for one block of "
                f"block_size + 1 = {block_size + 1}; use more text or a smaller block_size"
            )
        self.set_epoch(0)
        self.collate = partial(collate_lm, pad_id=pad_id)
        """`collate_fn` for a DataLoader: examples to a `Batch`."""

    def set_epoch(self, epoch: int) -> None:
        """Place the windows of `epoch` (the Trainer calls this before each epoch)."""
        n, last = len(self), len(self.stream) - self.block_size - 1  # the last valid offset
        rng = np.random.default_rng([self.seed, epoch])
        if self.windows == "random":
            self.starts = rng.integers(0, last + 1, size=n)
        else:
            shift = int(rng.integers(0, self.block_size)) if self.windows == "shifted" else 0
            # A shifted grid's last window may run past the end: it keeps its grid place.
            starts = shift + self.block_size * np.arange(n)
            self.starts = np.where(starts <= last, starts, starts - shift)

    @classmethod
    def from_files(
        cls,
        paths: PathLike | Sequence[PathLike],
        *,
        tokenizer: Tokenizer,
        block_size: int,
        split: str = "train",
        val_fraction: float = 0.1,
        option_names: tuple[str, str] = ("block_size", "val_fraction"),
    ) -> LanguageModelDataset:
        """One split of the text of `paths`, read in order as a single stream (`from_lines`)."""
        paths = [paths] if isinstance(paths, str | Path) else list(paths)
        return cls.from_lines(
            (line for path in paths for line in read_lines(path, keepends=True, pieces=True)),
            tokenizer=tokenizer,
            block_size=block_size,
            split=split,
            val_fraction=val_fraction,
            name=", ".join(map(str, paths)),
            option_names=option_names,
        )

    @classmethod
    def from_lines(
        cls,
        lines: Iterable[str],
        *,
        tokenizer: Tokenizer,
        block_size: int,
        split: str = "train",
        val_fraction: float = 0.1,
        name: str = "the text",
        option_names: tuple[str, str] = ("block_size", "val_fraction"),
        windows: str = "blocks",
        seed: int = 0,
    ) -> LanguageModelDataset:
        """One split of running text, given as lines with their newlines, as a single stream:
        the last `val_fraction` of its tokens are the `val` split.

        Newlines and empty lines are kept: in running text they are content.
        `name` says in errors where the text comes from. `option_names` are what the
        caller's user calls `block_size` and `val_fraction` (in a run config,
        `data.block_size` and `data.valid_fraction`), for the message when a split is
        too short. `windows` and `seed` place the windows (the class's docstring).
        """
        choice("split", split, SPLITS)
        within("val_fraction", val_fraction, "(0, 1)")
        stream = _Packed(
            _pack(tokenizer.encode_batch(chunk)) for chunk in _joined_chunks(lines)
        ).ids
        cut = int(len(stream) * (1.0 - val_fraction))
        # val copies its tail, so that the whole stream is freed once this returns.
        part = stream[:cut] if split == "train" else stream[cut:].copy()
        _warn_of_unknown(part, tokenizer, f"the {split} split of {name}")
        if len(part) < block_size + 1:
            raise AttnkitError(
                f"the {split} split of {name} has {len(part)} tokens, "
                f"fewer than block_size + 1 = {block_size + 1}; "
                f"lower {option_names[0]} or change {option_names[1]}"
            )
        return cls(part, block_size, pad_id=tokenizer.pad_id, windows=windows, seed=seed)

    def __len__(self) -> int:
        return max(0, (len(self.stream) - 1) // self.block_size)

    def __getitem__(self, index: int) -> np.ndarray:
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = int(self.starts[index])
        return self.stream[start : start + self.block_size + 1]

    def passes(self, examples: int) -> float:
        """How many times `examples` windows read the stream over (tokens read / tokens)."""
        return examples * (self.block_size + 1) / len(self.stream)

    @property
    def lengths(self) -> np.ndarray:
        return np.full((len(self), 1), self.block_size + 1, dtype=np.int64)


def _warn_of_unknown(ids: np.ndarray, tokenizer: Tokenizer, what: str) -> None:
    """Say how many tokens of `what` the tokenizer could only read as <unk>: characters its
    vocabulary lacks, which the model then learns (or is scored on) as one unknown token."""
    if not tokenizer.has("unk") or not len(ids):
        return
    unknown = int(np.count_nonzero(ids == tokenizer.unk_id))
    if unknown:
        logger.warning(
            "%d of the %d tokens of %s are <unk> (%.2f%%): text the tokenizer has no token for; "
            "a larger vocab_size or a byte-bpe tokenizer reads it",
            unknown,
            len(ids),
            what,
            100 * unknown / len(ids),
        )


def _joined_chunks(lines: Iterable[str], lines_per_piece: int = 64) -> Iterable[list[str]]:
    # Lines are encoded as pieces of running text rather than one by one, so
    # a word-level pre-tokenizer sees them as it would see the whole text;
    # many pieces per call keep the Rust backend's threads busy. A piece holds
    # `lines_per_piece` lines or PIECE_CHARS characters, a call CHUNK lines or
    # CHUNK * PIECE_CHARS / 64 characters, whichever comes first: long lines
    # (`read_lines`'s pieces of a corpus in one line) are encoded in the shape
    # that text in lines of 64 characters is.
    chunk: list[str] = []
    piece: list[str] = []
    piece_chars = chunk_chars = 0
    for line in lines:
        piece.append(line)
        piece_chars += len(line)
        if len(piece) == lines_per_piece or piece_chars >= PIECE_CHARS:
            chunk.append("".join(piece))
            chunk_chars += piece_chars
            piece, piece_chars = [], 0
        if len(chunk) * lines_per_piece >= CHUNK or chunk_chars >= CHUNK * PIECE_CHARS // 64:
            yield chunk
            chunk, chunk_chars = [], 0
    if piece:
        chunk.append("".join(piece))
    if chunk:
        yield chunk
