"""A damaged word2vec *text* file is never re-read as binary (issue 39, BAD 5): one malformed
value or one byte that is not UTF-8 made format detection take it for binary, so that
`embed nearest` printed 0.0000 for every word and `embed export` wrote vectors of 1e-19, exit 0.
Detection looks at the bytes, not at whether they parse; the damage is named by its line."""

from __future__ import annotations

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


def test_binary_files_are_still_told_apart(text_file, tmp_path) -> None:
    vectors = load_vectors(text_file)
    binary = save_vectors(vectors, tmp_path / "v.bin", binary=True)
    torch.testing.assert_close(load_vectors(binary).vectors, vectors.vectors, rtol=0, atol=0)
    assert load_vectors(binary).words == vectors.words
