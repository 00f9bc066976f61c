"""The extended vocabulary of a pointer-generator: unknown source words get ids of their own.

A vocabulary of V ids reads every word it lacks as <unk>. To let a model copy
such words (`nn/copy.py`), each sentence numbers the distinct unknown words of
its source: the i-th is id V + i, in the source and wherever its target has
the same word. A target's unknown word that its source lacks stays <unk>:
nothing could produce it. As in See et al.'s (2017) code, the numbers are per
sentence, and a batch's extended vocabulary is as wide as its sentence with the
most unknown words needs.

Decoding turns V + i back into the source's i-th unknown word, as written there.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from attnkit.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


def _with_unknown(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[tuple[int, str]]]:
    """Each text's ids, each with the text it covers when it is <unk> (else "")."""
    unk = tokenizer.unk_id
    # `encode_batch_fast`, which `Tokenizer` uses, skips the offsets that find the words.
    encodings = tokenizer.backend.encode_batch(list(texts), add_special_tokens=False)
    return [
        [(i, text[a:b] if i == unk else "") for i, (a, b) in zip(e.ids, e.offsets, strict=True)]
        for text, e in zip(texts, encodings, strict=True)
    ]


def unknown_words(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[str]]:
    """The words of each text that the vocabulary lacks, in order, repeats kept."""
    return [[w for _, w in pieces if w] for pieces in _with_unknown(tokenizer, texts)]


def encode_sources(
    tokenizer: Tokenizer, texts: Sequence[str], max_length: int | None = None
) -> tuple[list[list[int]], list[list[str]]]:
    """Source ids ending in </s> with unknown words as V + i, and each source's unknown words.

    `max_length` cuts longer sources (their </s> kept), as `Tokenizer.encode_batch` does.
    """
    vocab, ids, unknown, cut = tokenizer.vocab_size, [], [], 0
    for pieces in _with_unknown(tokenizer, texts):
        if max_length is not None and len(pieces) > max_length - 1:
            pieces, cut = pieces[: max_length - 1], cut + 1
        words: list[str] = []
        row = []
        for i, word in pieces:
            if word:
                if word not in words:
                    words.append(word)
                i = vocab + words.index(word)
            row.append(i)
        ids.append([*row, tokenizer.eos_id])
        unknown.append(words)
    if cut:
        tokenizer.n_truncated += cut
        logger.warning("truncated %d of %d sources to max_length %d", cut, len(ids), max_length)
    return ids, unknown


def encode_targets(
    tokenizer: Tokenizer, texts: Sequence[str], unknown: Sequence[Sequence[str]]
) -> list[list[int]]:
    """Target ids <s> ... </s>, an unknown word as V + i where it is its source's i-th."""
    vocab, out = tokenizer.vocab_size, []
    for pieces, words in zip(_with_unknown(tokenizer, texts), unknown, strict=True):
        row = [vocab + words.index(w) if w in words else i for i, w in pieces]
        out.append([tokenizer.bos_id, *row, tokenizer.eos_id])
    return out


def encode_pairs(tokenizer: Tokenizer, sources: list[str], targets: list[str]) -> list[list]:
    """Both sides of sentence pairs in the extended vocabulary: [source ids, target ids]."""
    src, unknown = encode_sources(tokenizer, sources)
    return [src, encode_targets(tokenizer, targets, unknown)]


def decode(
    tokenizer: Tokenizer, rows: Sequence[Sequence[int]], unknown: Sequence[Sequence[str]]
) -> list[str]:
    """Text of extended ids, each V + i its source's i-th unknown word as written there.

    The row is detokenized whole, every extended id standing as <unk>, so the
    tokenizer's own rules place each copy (a word between spaces, a character
    inside its word); then the i-th <unk> of the text becomes the i-th copy. An
    <unk> the model generated itself, or an id its source has no word for, becomes
    nothing, as special tokens do.
    """
    vocab, unk = tokenizer.vocab_size, tokenizer.unk_id
    marker = tokenizer.id_to_token(unk)
    special = {
        getattr(tokenizer, f"{r}_id") for r in ("pad", "bos", "eos", "mask") if tokenizer.has(r)
    }
    out = []
    for row, words in zip(rows, unknown, strict=True):
        ids = [i for i in map(int, row) if i not in special]
        fills = [
            words[i - vocab] if 0 <= i - vocab < len(words) else ""
            for i in ids
            if i >= vocab or i == unk
        ]
        text = tokenizer.decode([unk if i >= vocab else i for i in ids], skip_special=False)
        pieces = text.split(marker)
        fills += [""] * (len(pieces) - len(fills))  # the text after the last <unk>
        filled = "".join(piece + fill for piece, fill in zip(pieces, fills, strict=False))
        out.append(" ".join(filled.split()))
    return out
