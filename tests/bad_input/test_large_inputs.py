"""Memory stays bounded on a corpus in one line (issue 39, BAD 6): a 60 MB corpus in one line
(text8's shape) grew a character language-model run to 24 GB, because the line was read whole
and handed to the tokenizer in one call. Running text is read in pieces (`read_lines(...,
pieces=True)`) and encoded at most about half a million characters a call, giving the ids the
whole line gives. The memory itself, at 100 MB, is measured by `python -m bench corpus-memory`
(docs/results/corpus-memory.md)."""

from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np
import pytest

from attnkit.data.datasets import CHUNK, PIECE_CHARS, LanguageModelDataset
from attnkit.files import PIECE_BYTES, decode_lines, read_lines
from attnkit.tokenizer import Tokenizer


def words(n_chars: int, seed: int = 0) -> str:
    """Running text of about `n_chars` characters, words of a small vocabulary, some not ASCII."""
    rng = random.Random(seed)
    vocabulary = ["".join(rng.choices("abcdeéfghijklmnoüpqrstuvwxyz", k=rng.randint(1, 9)))]
    vocabulary += ["".join(rng.choices("abcdefghij", k=rng.randint(1, 9))) for _ in range(300)]
    text = []
    while sum(map(len, text)) < n_chars:
        text.append(" ".join(rng.choices(vocabulary, k=1000)) + rng.choice([" ", ",  ", ". "]))
    return "".join(text)


@pytest.fixture(scope="module")
def one_line(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "one_line.txt"
    path.write_text(words(1_500_000) + "\n")
    return path


def test_a_long_line_is_read_in_pieces_that_join_into_it(one_line) -> None:
    pieces = list(read_lines(one_line, keepends=True, pieces=True))
    assert "".join(pieces) == one_line.read_text()
    assert len(pieces) > 300 and max(len(p.encode()) for p in pieces) <= 2 * PIECE_BYTES
    # Cut before a single space between two words, so word-level tokenizers see whole words.
    assert all(p[0] == " " and p[1] != " " for p in pieces[1:])


def test_a_piece_that_is_not_utf8_is_named_by_its_line_and_byte() -> None:
    data = b"a" * (3 * PIECE_BYTES) + b" b\xe9\nnext\n"
    with pytest.raises(
        Exception, match=rf"x line 1 is not valid UTF-8 \(byte {3 * PIECE_BYTES + 2}"
    ):
        list(decode_lines(io.BytesIO(data), "x", keepends=True, pieces=True))


class Counting:
    """A tokenizer that remembers the most characters it was given in one call."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer, self.most = tokenizer, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.tokenizer, name)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        self.most = max(self.most, sum(map(len, texts)))
        return self.tokenizer.encode_batch(texts)


@pytest.mark.parametrize("kind", ["char", "byte-bpe", "bpe"])
def test_a_corpus_in_one_line_is_encoded_in_bounded_calls_to_the_ids_of_the_whole(
    one_line, kind
) -> None:
    tokenizer = Tokenizer.train(kind, files=[one_line], vocab_size=400)
    counting = Counting(tokenizer)
    dataset = LanguageModelDataset.from_lines(
        read_lines(one_line, keepends=True, pieces=True),
        tokenizer=counting,  # type: ignore[arg-type]
        block_size=64,
        split="val",
    )
    assert counting.most <= CHUNK * PIECE_CHARS // 64 + 2 * PIECE_BYTES
    whole = np.array(tokenizer.encode_batch([one_line.read_text()])[0], dtype=np.int32)
    np.testing.assert_array_equal(dataset.stream, whole[int(len(whole) * 0.9) :])
