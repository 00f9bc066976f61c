"""Word vectors: a vocabulary with one dense vector per word, its files and its queries.

Words are points of R^d; two words are alike when their vectors point the same
way, so every query works on the unit vectors u_w = v_w / |v_w|:

    similarity(a, b) = cos(v_a, v_b) = u_a . u_b
    most_similar(P, N) = argmax_{w not in P, N} cos(v_w, sum_{p in P} u_p - sum_{n in N} u_n)

and the analogy "a is to b as c is to ?" (king - man + woman ~ queen: a=man,
b=king, c=woman) is most_similar([b, c], [a]), the 3CosAdd of Mikolov et al.
(2013) as gensim's `most_similar` computes it. `restrict` keeps the search to
the first words, which files order by frequency.

Files (gzipped too): the word2vec text format (a "count dim" header, then "word v1 .. vd" a
line), its binary format (the same header, then each word, a space and d
little-endian float32, a newline after each as the C tool writes), and GloVe's
text format (no header). `load_vectors` tells them apart by themselves.
"""

from __future__ import annotations

import codecs
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from attnkit.errors import AttnkitError
from attnkit.files import PathLike, atomic_write, open_binary, read_lines

log = logging.getLogger(__name__)

FORMATS = ("auto", "word2vec", "word2vec-binary", "glove")


@dataclass
class WordVectors:
    """`words[i]`'s vector is `vectors[i]` (float32, one row a word, most frequent first)."""

    words: list[str]
    vectors: Tensor
    index: dict[str, int] = field(init=False, repr=False)
    _unit: Tensor | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.vectors = torch.as_tensor(self.vectors, dtype=torch.float32)
        if self.vectors.dim() != 2 or self.vectors.shape[0] != len(self.words):
            raise AttnkitError(
                f"word vectors need one row per word: {len(self.words)} words but vectors "
                f"of shape {tuple(self.vectors.shape)}."
            )
        self.index = {}
        for i, word in enumerate(self.words):
            self.index.setdefault(word, i)  # a repeated word keeps its first (most frequent) row

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: object) -> bool:
        return word in self.index

    def __getitem__(self, word: str) -> Tensor:
        return self.vectors[self._id(word)]

    @property
    def dim(self) -> int:
        return self.vectors.shape[1]

    @property
    def unit(self) -> Tensor:
        """Every vector scaled to length 1 (a zero vector stays zero)."""
        if self._unit is None:
            norms = self.vectors.norm(dim=1, keepdim=True)
            self._unit = self.vectors / norms.clamp_min(1e-12)
        return self._unit

    def similarity(self, a: str, b: str) -> float:
        """cos(v_a, v_b)."""
        return float(self.unit[self._id(a)] @ self.unit[self._id(b)])

    def nearest(
        self, word: str | Tensor, k: int = 10, restrict: int | None = None
    ) -> list[tuple[str, float]]:
        """The k words closest in cosine to a word (itself left out) or to a vector."""
        if isinstance(word, str):
            return self.most_similar([word], k=k, restrict=restrict)
        query = torch.as_tensor(word, dtype=torch.float32)
        return self._top(query / query.norm().clamp_min(1e-12), set(), k, restrict)

    def analogy(
        self, a: str, b: str, c: str, k: int = 1, restrict: int | None = None
    ) -> list[tuple[str, float]]:
        """a is to b as c is to ?: the words nearest to u_b - u_a + u_c (3CosAdd)."""
        return self.most_similar([b, c], [a], k=k, restrict=restrict)

    def most_similar(
        self,
        positive: Sequence[str],
        negative: Sequence[str] = (),
        k: int = 10,
        restrict: int | None = None,
    ) -> list[tuple[str, float]]:
        """The k words nearest to sum(u_positive) - sum(u_negative), the query words left out."""
        ids = [self._id(w) for w in positive] + [self._id(w) for w in negative]
        if not positive:
            raise AttnkitError("most_similar needs at least one positive word.")
        signs = torch.tensor([1.0] * len(positive) + [-1.0] * len(negative))
        query = (signs[:, None] * self.unit[ids]).sum(0)
        return self._top(query / query.norm().clamp_min(1e-12), set(ids), k, restrict)

    def _top(
        self, query: Tensor, exclude: set[int], k: int, restrict: int | None
    ) -> list[tuple[str, float]]:
        # A row holding NaN (`load_vectors` warns of it) has no direction: it ranks last.
        scores = (self.unit[: restrict or len(self)] @ query).nan_to_num(nan=-torch.inf)
        scores[[i for i in exclude if i < len(scores)]] = -torch.inf
        top = scores.topk(min(k, max(len(scores) - len(exclude), 0)))
        return [
            (self.words[i], float(s)) for s, i in zip(top.values, top.indices.tolist(), strict=True)
        ]

    def _id(self, word: str) -> int:
        try:
            return self.index[word]
        except KeyError:
            raise AttnkitError(
                f"{word!r} is not among the {len(self)} words of these vectors."
            ) from None


def save_vectors(vectors: WordVectors, path: PathLike, binary: bool = False) -> Path:
    """Write the word2vec text (or, if `binary`, binary) format that gensim's KeyedVectors loads."""
    for word in vectors.words:
        if not word or any(ch.isspace() for ch in word):
            raise AttnkitError(
                f"the word {word!r} is empty or has white space, which word2vec files cannot hold."
            )
    rows = vectors.vectors.numpy().astype("<f4")
    header = f"{len(vectors)} {vectors.dim}\n"

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(header.encode())
            for word, row in zip(vectors.words, rows, strict=True):
                if binary:
                    f.write(word.encode() + b" " + row.tobytes() + b"\n")
                else:
                    # %.9g gives back every float32 exactly
                    f.write((word + " " + " ".join(f"{x:.9g}" for x in row) + "\n").encode())

    return atomic_write(path, write)


def load_vectors(path: PathLike, format: str = "auto", limit: int | None = None) -> WordVectors:
    """Read word2vec text or binary or GloVe text vectors (gzipped too, `.gz`), the first
    `limit` words if given.

    `format="auto"` reads a "count dim" first line as a word2vec header, and then
    text if the next line is a word and dim numbers, else binary.
    """
    if format not in FORMATS:
        raise AttnkitError(f"unknown vector format {format!r}; choose one of {', '.join(FORMATS)}.")
    if limit is not None and limit < 1:
        raise AttnkitError(f"a limit on the words read must be 1 or more, not {limit}.")
    path = Path(path)
    if not path.is_file():
        raise AttnkitError(f"no vector file at {path}.")
    if format == "auto":
        format = _sniff(path)
    if format == "word2vec-binary":
        return _warn_of_oddities(_read_binary(path, limit), path)
    return _warn_of_oddities(_read_text(path, header=format == "word2vec", limit=limit), path)


def _warn_of_oddities(vectors: WordVectors, path: Path) -> WordVectors:
    """Say what a file holds that queries would otherwise pass over in silence: rows that are
    not finite (which rank last) and words listed twice (the first row is the one used)."""
    bad = (~torch.isfinite(vectors.vectors).all(dim=1)).nonzero().flatten().tolist()
    if bad:
        log.warning(
            "%s: %d vectors hold NaN or infinite values (first: %r, vector %d); they rank last "
            "in every query",
            path,
            len(bad),
            vectors.words[bad[0]],
            bad[0] + 1,
        )
    repeated = len(vectors.words) - len(vectors.index)
    if repeated:
        first = next(w for i, w in enumerate(vectors.words) if vectors.index[w] != i)
        log.warning(
            "%s: %d words are listed more than once (first: %r); each keeps its first vector",
            path,
            repeated,
            first,
        )
    return vectors


def _warn_of_count(path: Path, count: int, found: int | None) -> None:
    """A word2vec header whose count is not the number of vectors the file holds (None: more,
    which a binary file's count keeps from being read)."""
    holds = "more" if found is None else str(found)
    log.warning(
        "%s: its header says %d vectors, but it holds %s; read %d",
        path,
        count,
        holds,
        found or count,
    )


# How many of a first vector's bytes are looked at: enough to tell text from binary.
_SNIFF_BYTES = 1 << 16


def _sniff(path: Path) -> str:
    """ "glove" without a word2vec header, else "word2vec" (text) or "word2vec-binary".

    The header gives the dimension, so a binary file's first vector is the word, a space and
    then 4 * dim bytes of raw float32. Those bytes are looked at as bytes: text is (almost
    all) printable UTF-8, whatever its numbers say, while raw floats are mostly not (0.1 is
    cd cc cc 3d, 1.0 is 00 00 80 3f, and a negative one begins with a byte over 0x7f). So a
    text file with a malformed value or a stray Latin-1 byte is read as text and refused
    naming its line, never taken for binary, however unlike a number its first row looks.
    """
    with open_binary(path) as f:
        first = f.readline().split()
        if not (len(first) == 2 and all(x.isdigit() for x in first)):
            return "glove"
        width = min(4 * int(first[1]), _SNIFF_BYTES)
        head = f.read(width + 1024).lstrip(b"\n")
    space = head.find(b" ")
    after = head[space + 1 : space + 1 + width] if space >= 0 else b""
    if not after:  # no vector to look at: the text reader says what is missing
        return "word2vec"
    # A character cut at the end is left undecoded, not counted against the text.
    decoded = codecs.getincrementaldecoder("utf-8")("surrogateescape").decode(after)
    odd = sum(1 for c in decoded if "\udc80" <= c <= "\udcff" or (c < " " and c not in "\t\n\r"))
    return "word2vec-binary" if odd > len(after) / 4 else "word2vec"


def _header(line: bytes | str, path: Path) -> tuple[int, int]:
    """The "count dim" first line of a word2vec file."""
    fields = line.split()
    if len(fields) != 2 or not all(x.isdigit() and int(x) > 0 for x in fields):
        raise AttnkitError(
            f'{path} does not begin with word2vec\'s header "count dim"; '
            'for GloVe\'s format (no header) pass format="glove" (--format glove).'
        )
    return int(fields[0]), int(fields[1])


def _read_text(path: Path, header: bool, limit: int | None) -> WordVectors:
    words: list[str] = []
    rows: list[np.ndarray] = []
    dim = count = None
    for number, line in enumerate(read_lines(path), start=1):
        if header and number == 1:
            count, dim = _header(line, path)
            continue
        if limit is not None and len(words) >= limit:
            break
        if not line.strip():
            continue
        fields = line.rstrip().split(" ")
        dim = dim or len(fields) - 1
        if len(fields) < dim + 1:
            raise AttnkitError(
                f"{path}, line {number}: a word and {dim} numbers expected, {len(fields)} found."
            )
        try:
            rows.append(np.array(fields[len(fields) - dim :], dtype=np.float32))
        except ValueError:
            bad = next(x for x in fields[len(fields) - dim :] if not _is_number(x))
            raise AttnkitError(
                f"{path}, line {number}: the value {bad!r} is not a number."
            ) from None
        # GloVe's larger files have words with spaces in them: the vector is the last dim fields
        words.append(" ".join(fields[: len(fields) - dim]))
    if dim is None or not words:
        raise AttnkitError(f"{path} holds no word vectors.")
    if count is not None and limit is None and count != len(words):
        _warn_of_count(path, count, len(words))
    return WordVectors(words, torch.from_numpy(np.stack(rows)))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _read_binary(path: Path, limit: int | None) -> WordVectors:
    """Each vector: the word's bytes, a space, dim little-endian float32, maybe a newline;
    read a megabyte at a time, so a limit reads only what it needs."""
    with open_binary(path) as f:
        count, dim = _header(f.readline(), path)
        count = min(count, limit) if limit is not None else count
        width = 4 * dim
        vectors = np.empty((count, dim), dtype=np.float32)
        words: list[str] = []
        buffer, at = b"", 0
        for i in range(count):
            while (space := buffer.find(b" ", at)) < 0 or len(buffer) < space + 1 + width:
                more = f.read(1 << 20)
                if not more:
                    raise AttnkitError(f"{path} ends after {i} of its {count} vectors.")
                buffer, at = buffer[at:] + more, 0
            word = buffer[at:space].lstrip(b"\n")  # the C tool's newline after each vector
            if not word:
                raise AttnkitError(f"{path}: the word of vector {i + 1} is empty.")
            words.append(word.decode("utf-8", errors="replace"))
            vectors[i] = np.frombuffer(buffer, dtype="<f4", count=dim, offset=space + 1)
            at = space + 1 + width
        if limit is None and (buffer[at:] + f.read(1 << 12)).strip():
            _warn_of_count(path, count, None)
    return WordVectors(words, torch.from_numpy(vectors))
