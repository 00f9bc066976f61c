"""The digit-reversal task: random digit strings (source) and the same digits reversed (target).

The copy task's harder cousin, generated in code, so it needs no data and no
trained tokenizer: its vocabulary is fixed, the four special tokens of every
attnkit vocabulary, then the ten digits. Reversal forces the decoder's
cross-attention to learn an anti-diagonal alignment. A source ends in </s>
and `tokenizer()` spells the vocabulary as a character-level `Tokenizer`, so
the trained run folder is one that `attnkit translate` reads like any other.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from attnkit.data.batch import Batch, pad
from attnkit.tokenizer import Tokenizer

PAD, BOS, EOS = 0, 1, 2
DIGIT0 = 4  # ids 4..13 are the digits 0..9; 3 is left for <unk> as in every attnkit vocabulary
VOCAB = ["<pad>", "<s>", "</s>", "<unk>", *"0123456789"]

Pair = tuple[list[int], list[int]]


@dataclass(frozen=True)
class ReverseTask:
    """Source: `min_len` to `max_len` random digits; target: the same digits reversed."""

    min_len: int = 4
    max_len: int = 12

    def sample(self, n: int, generator: torch.Generator) -> list[Pair]:
        lengths = torch.randint(self.min_len, self.max_len + 1, (n,), generator=generator)
        pairs = []
        for length in lengths.tolist():
            digits = (torch.randint(0, 10, (length,), generator=generator) + DIGIT0).tolist()
            pairs.append((digits, digits[::-1]))
        return pairs

    def batch(self, pairs: list[Pair]) -> Batch:
        # A source ends in </s> as every translation source does (`attnkit.inference`).
        src, src_mask = pad([[*s, EOS] for s, _ in pairs], PAD)
        tgt, tgt_mask = pad([[BOS, *t, EOS] for _, t in pairs], PAD)
        return Batch(src, src_mask, tgt, tgt_mask)


class ReverseBatches:
    """`batches_per_epoch` random batches per epoch, the same for the same (seed, epoch)."""

    def __init__(
        self, task: ReverseTask, batch_size: int, seed: int, batches_per_epoch: int = 500
    ) -> None:
        self.task, self.batch_size, self.seed = task, batch_size, seed
        self.batches_per_epoch = batches_per_epoch
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.batches_per_epoch

    def __iter__(self) -> Iterator[Batch]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        for _ in range(self.batches_per_epoch):
            yield self.task.batch(self.task.sample(self.batch_size, generator))


def show(ids: list[int]) -> str:
    """The text of ids: the digits, and the special tokens by name."""
    return "".join(VOCAB[i] if i < len(VOCAB) else "?" for i in ids)


def tokenizer() -> Tokenizer:
    """The task's vocabulary as a character-level `Tokenizer`: one digit a token, the ids above.

    Saved in the demo's run folder, it lets `attnkit translate` read digit
    strings and write the model's output as digits.
    """
    backend = Backend(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<unk>"))
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in VOCAB[:DIGIT0]]
    )
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return Tokenizer(backend)
