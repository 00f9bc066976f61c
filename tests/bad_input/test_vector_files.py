"""A damaged word2vec *text* file is never re-read as binary (issue 39, BAD 5): one malformed
value or one byte that is not UTF-8 made format detection take it for binary, so that
`embed nearest` printed 0.0000 for every word and `embed export` wrote vectors of 1e-19, exit 0.
Detection looks at the bytes, not at whether they parse; the damage is named by its line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from attnkit import AttnkitError
from attnkit.cli import main
from attnkit.embeddings.vectors import WordVectors, load_vectors, save_vectors


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    """A word2vec text file of 20 words of 50 dimensions, as real vectors look."""
    torch.manual_seed(0)
    words = ["the", "cat", "sat", "on", "mat", *[f"w{i}" for i in range(15)]]
    return save_vectors(WordVectors(words, 0.1 * torch.randn(20, 50)), tmp_path / "v.txt")


def damage(path: Path, line: int, old: bytes, new: bytes) -> None:
    lines = path.read_bytes().split(b"\n")
    assert old in lines[line - 1]
    lines[line - 1] = lines[line - 1].replace(old, new, 1)
    path.write_bytes(b"\n".join(lines))


def first_value(path: Path, line: int) -> bytes:
    return path.read_bytes().split(b"\n")[line - 1].split(b" ")[1]


@pytest.mark.parametrize("line", [2, 7])
def test_a_malformed_value_is_named_by_its_line(text_file, line, capsys) -> None:
    damage(text_file, line, b" " + first_value(text_file, line), b" 0.1x3")
    with pytest.raises(AttnkitError, match=rf"v\.txt, line {line}: the value '0\.1x3' is not a"):
        load_vectors(text_file)
    assert main(["embed", "nearest", str(text_file), "cat"]) == 2
    assert f"line {line}: the value '0.1x3' is not a number" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("line", "old", "new"),
    [(2, b"the", b"th\xe9"), (2, b"-", b"\xad"), (7, b"w0", b"\xe9t\xe9")],
    ids=["Latin-1 in the first word", "Latin-1 in a value", "Latin-1 in a later word"],
)
def test_a_byte_that_is_not_utf8_is_named_by_its_line_and_byte(
    text_file, tmp_path, line, old, new, capsys
) -> None:
    damage(text_file, line, old, new)
    with pytest.raises(AttnkitError, match=rf"v\.txt line {line} is not valid UTF-8 \(byte \d+"):
        load_vectors(text_file)
    out = tmp_path / "out.txt"
    assert main(["embed", "export", str(text_file), str(out), "--limit", "10"]) == 2
    assert f"line {line} is not valid UTF-8" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    "row",
    [b"dog 0.1 0.2 abc 0.4", b"dog abc def ghi jkl", b"dog 1 2 3 x"],
    ids=["one", "all", "short"],
)
def test_a_bad_value_in_the_first_vector_is_text_with_its_line(tmp_path, row, capsys) -> None:
    """However unlike a number the first row looks, its bytes are text, not raw floats."""
    path = tmp_path / "v.txt"
    path.write_bytes(b"3 4\n" + row + b"\ncat 0.1 0.2 0.3 0.4\nsat 0.5 0.6 0.7 0.8\n")
    with pytest.raises(AttnkitError, match=r"v\.txt, line 2: the value '[a-z]+' is not a number"):
        load_vectors(path)
    assert main(["embed", "nearest", str(path), "cat"]) == 2
    assert "line 2: the value" in capsys.readouterr().err


@pytest.mark.parametrize("value", [0.1, 1.0, 3.0, -2.5])
def test_a_binary_file_of_one_dimension_is_binary(tmp_path, value) -> None:
    vectors = WordVectors(["a", "b"], torch.tensor([[value], [0.5]]))
    read = load_vectors(save_vectors(vectors, tmp_path / "v.bin", binary=True))
    assert read.words == ["a", "b"]
    torch.testing.assert_close(read.vectors, vectors.vectors, rtol=0, atol=0)


def test_a_text_file_of_wide_characters_and_short_values_is_text(tmp_path) -> None:
    path = tmp_path / "v.txt"
    path.write_text("2 1\n狗 1\n猫 2\n", encoding="utf-8")
    assert load_vectors(path).words == ["狗", "猫"]


def test_binary_files_are_still_told_apart(text_file, tmp_path) -> None:
    vectors = load_vectors(text_file)
    binary = save_vectors(vectors, tmp_path / "v.bin", binary=True)
    torch.testing.assert_close(load_vectors(binary).vectors, vectors.vectors, rtol=0, atol=0)
    assert load_vectors(binary).words == vectors.words


# -- what a vectors file holds that queries passed over in silence (issue 39, POOR) -------------


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_a_header_count_that_disagrees_with_the_rows_is_said(tmp_path, caplog, binary) -> None:
    vectors = WordVectors(["a", "b", "c"], torch.eye(3))
    path = save_vectors(vectors, tmp_path / "v", binary=binary)
    path.write_bytes(path.read_bytes().replace(b"3 3\n", b"2 3\n", 1))
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        read = load_vectors(path)
    holds = "more" if binary else "3"
    assert f"its header says 2 vectors, but it holds {holds}; read {2 if binary else 3}" in (
        caplog.text
    )
    assert len(read) == (2 if binary else 3)


def test_a_row_holding_nan_is_said_and_ranks_last(tmp_path, caplog) -> None:
    rows = torch.tensor([[1.0, 0.0], [0.9, 0.1], [float("nan"), 1.0], [0.0, 1.0]])
    path = save_vectors(WordVectors(["a", "b", "bad", "d"], rows), tmp_path / "v.txt")
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        vectors = load_vectors(path)
    assert "1 vectors hold NaN or infinite values (first: 'bad', vector 3)" in caplog.text
    assert [word for word, _ in vectors.most_similar(["a"], k=3)] == ["b", "d", "bad"]


def test_a_word_listed_twice_is_said(tmp_path, caplog) -> None:
    path = save_vectors(WordVectors(["a", "b", "a"], torch.eye(3)), tmp_path / "v.txt")
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        vectors = load_vectors(path)
    assert "1 words are listed more than once (first: 'a'); each keeps its first vector" in (
        caplog.text
    )
    assert torch.equal(vectors["a"], torch.tensor([1.0, 0.0, 0.0]))
