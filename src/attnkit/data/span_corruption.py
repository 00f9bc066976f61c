"""T5's span corruption (Raffel et al. 2020, section 3.1.4 and 3.3.4): the pre-training
objective that drops spans of the input and asks the decoder for them.

Of a sequence of n tokens, round(n * noise_density) are dropped (15% in T5), in
round(dropped / mean_span_length) spans (mean length 3); the span lengths are a
random split of the dropped count, and of the kept count, into that many parts
each, the spans interleaved kept-first. Each dropped span becomes one sentinel in
the input; the target is every sentinel followed by the span it replaced:

    Thank you for inviting me to your party last week .
    input:   Thank you <X> me to your party <Y> week .
    target:  <X> for inviting <Y> last <Z>

(with a final sentinel <Z> that closes the last span). Sentinels are ids the
vocabulary sets apart (T5's <extra_id_0>, <extra_id_1>, ...), given in order.
The split is as T5's `random_spans_noise_mask`: every span has at least one
token, and at least one token is dropped and one kept.

`SpanCorruptionDataset` is the `data.task = "span-corruption"` training data:
sentences corrupted afresh each epoch (as RoBERTa masks afresh, where T5 saw
each of its C4 examples once), example i of epoch e by a generator seeded by
(seed, e, i), so a resumed run reads what the uninterrupted one would have.
How many tokens are dropped, and in how many spans, depends on the length
alone, so the lengths the token budget batches by are known before any draw.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from functools import partial
from itertools import pairwise

import numpy as np
import torch
from torch.utils.data import Dataset

from attnkit.data.collate import collate_translation
from attnkit.data.datasets import SentenceDataset
from attnkit.errors import AttnkitError
from attnkit.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

SENTINEL = "<extra_id_{}>"  # T5's spelling, so an exported vocabulary reads as T5's


def _random_split(total: int, parts: int, generator: torch.Generator) -> list[int]:
    """`total` split into `parts` positive lengths at random (a random composition)."""
    cuts = torch.randperm(total - 1, generator=generator)[: parts - 1].add(1).sort().values
    edges = [0, *cuts.tolist(), total]
    return [b - a for a, b in pairwise(edges)]


def span_counts(length: int, noise_density: float, mean_span_length: float) -> tuple[int, int]:
    """How many of `length` tokens are dropped, and in how many spans."""
    dropped = min(max(round(length * noise_density), 1), length - 1)
    spans = max(round(dropped / mean_span_length), 1)
    return dropped, min(spans, dropped, length - dropped)


def sentinels_needed(max_length: int, noise_density: float, mean_span_length: float) -> int:
    """Sentinels that any sequence of 2 to `max_length` tokens may use: one a span, and the
    closing one."""
    spans = (span_counts(n, noise_density, mean_span_length)[1] for n in range(2, max_length + 1))
    return max(spans, default=1) + 1


def sentinel_tokens(count: int) -> list[str]:
    """The first `count` sentinels' tokens, `<extra_id_0>`, `<extra_id_1>`, ..."""
    return [SENTINEL.format(i) for i in range(count)]


def sentinel_ids(tokenizer: Tokenizer, count: int) -> list[int]:
    """The ids of the first `count` sentinels in `tokenizer`'s vocabulary."""
    ids = [tokenizer.token_to_id(token) for token in sentinel_tokens(count)]
    if None in ids:
        missing = sentinel_tokens(count)[ids.index(None)]
        raise AttnkitError(
            f"span corruption needs {count} sentinel tokens, but the tokenizer has no {missing}; "
            "pre-train with a tokenizer trained for data.task 'span-corruption', or lower "
            "data.max_len"
        )
    return ids  # type: ignore[return-value]


def noise_mask(
    length: int, noise_density: float, mean_span_length: float, generator: torch.Generator
) -> list[bool]:
    """Which of `length` tokens are dropped (True), in spans as the module docstring says."""
    dropped, spans = span_counts(length, noise_density, mean_span_length)
    noise = _random_split(dropped, spans, generator)
    kept = _random_split(length - dropped, spans, generator)
    mask: list[bool] = []
    for keep, drop in zip(kept, noise, strict=True):
        mask += [False] * keep + [True] * drop
    return mask


def span_corruption(
    ids: Sequence[int],
    sentinels: Sequence[int],
    generator: torch.Generator,
    noise_density: float = 0.15,
    mean_span_length: float = 3.0,
) -> tuple[list[int], list[int]]:
    """The input (spans replaced by sentinels) and the target (sentinel, span, ..., sentinel)
    of one sequence of ids."""
    if len(ids) < 2:
        raise AttnkitError(f"span corruption needs at least 2 tokens, got {len(ids)}")
    if not 0 < noise_density < 1 or mean_span_length < 1:
        raise AttnkitError(
            f"span corruption needs 0 < noise_density < 1 and mean_span_length >= 1, got "
            f"{noise_density} and {mean_span_length}"
        )
    mask = noise_mask(len(ids), noise_density, mean_span_length, generator)
    inputs: list[int] = []
    targets: list[int] = []
    used = 0
    for i, (token, dropped) in enumerate(zip(ids, mask, strict=True)):
        starts = dropped and (i == 0 or not mask[i - 1])
        if starts:
            if used == len(sentinels):
                raise AttnkitError(
                    f"this sequence of {len(ids)} tokens has more spans than the "
                    f"{len(sentinels)} sentinels; give more sentinel ids or shorter sequences"
                )
            inputs.append(sentinels[used])
            targets.append(sentinels[used])
            used += 1
        (targets if dropped else inputs).append(token)
    if used == len(sentinels):
        raise AttnkitError(
            f"the closing sentinel needs one more than the {len(sentinels)} sentinel ids"
        )
    targets.append(sentinels[used])
    return inputs, targets


class SpanCorruptionDataset(Dataset):
    """Sentences as (input ids ending in </s>, target ids <s> sentinel span ... </s>) pairs,
    each corrupted afresh every epoch (`set_epoch`), for an encoder-decoder.

    max_len: the most ids a sentence may have with <s> and </s>, and either side of its pair;
        longer ones are skipped and counted, and so are sentences of one token.
    sentinels: the sentinel ids in order, at least `sentinels_needed(max_len, ...)`.
    """

    def __init__(
        self,
        sentences: Iterable[str],
        tokenizer: Tokenizer,
        *,
        sentinels: Sequence[int],
        max_len: int,
        noise_density: float = 0.15,
        mean_span_length: float = 3.0,
        seed: int = 0,
        name: str = "sentences",
    ) -> None:
        self.sentences = SentenceDataset(sentences, tokenizer, max_len=max_len, name=name)
        self.noise = (noise_density, mean_span_length)
        self.sentinels, self.seed, self.epoch = list(sentinels), seed, 0
        self.bos, self.eos = tokenizer.bos_id, tokenizer.eos_id
        # Each kept sentence's ids lie between its <s> and </s>: at least 2 to corrupt.
        inner = self.sentences.lengths[:, 0] - 2
        candidates = np.flatnonzero(inner >= 2)
        n = inner[candidates]
        counts = np.array([span_counts(int(k), *self.noise) for k in n]).reshape(-1, 2)
        dropped, spans = counts[:, 0], counts[:, 1]
        # Input: the kept tokens, a sentinel a span, </s>; target: <s>, a sentinel a span and
        # the closing one, the dropped tokens, </s>.
        lengths = np.stack([n - dropped + spans + 1, dropped + spans + 3], axis=1)
        fits = lengths.max(axis=1) <= max_len  # a very short sentence's target can be longer
        self.index, self._lengths = candidates[fits], lengths[fits]
        if len(self.index) == 0:
            raise AttnkitError(
                f"{name} has no sentence to corrupt: each has fewer than 2 tokens or a "
                f"corrupted pair longer than max_len {max_len}"
            )
        skipped = len(inner) - len(self.index)
        if skipped:
            logger.warning(
                "%s: skipped %d sentences of one token or whose target would pass max_len %d",
                name,
                skipped,
                max_len,
            )
        self.collate = partial(
            collate_translation, src_pad_id=tokenizer.pad_id, tgt_pad_id=tokenizer.pad_id
        )
        """`collate_fn` for a DataLoader: examples to a `Batch`."""

    def set_epoch(self, epoch: int) -> None:
        """Corrupt the sentences of `epoch` (the Trainer calls this before each epoch)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.index)

    @property
    def lengths(self) -> np.ndarray:
        """Ids per example, shape (examples, 2): what `TokenBudgetSampler` batches by."""
        return self._lengths

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        ids = self.sentences[int(self.index[index])][1:-1].tolist()
        state = np.random.SeedSequence([self.seed, self.epoch, index]).generate_state(1)
        generator = torch.Generator().manual_seed(int(state[0]))
        inputs, targets = span_corruption(ids, self.sentinels, generator, *self.noise)
        return (
            np.array([*inputs, self.eos], dtype=np.int64),
            np.array([self.bos, *targets, self.eos], dtype=np.int64),
        )
