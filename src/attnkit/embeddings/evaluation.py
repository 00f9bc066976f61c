"""How good word vectors are, as the field measures it.

Word similarity: people rated pairs of words (WordSim-353: relatedness, "cup"
and "coffee" score high; SimLex-999: similarity proper, "cup" and "coffee"
score low). The vectors' cosine of each pair is ranked against the people's
scores, and the Spearman correlation rho (Pearson's r of the ranks, ties given
their mean rank) is the score. Pairs with a word the vectors lack are left out
and counted, as gensim's `evaluate_word_pairs` does.

Analogies: Mikolov et al.'s (2013) 19,544 Google questions "a b c d" (Athens
Greece Baghdad Iraq), 5 semantic and 9 syntactic sections. A question is right
when d is the word nearest to u_b - u_a + u_c among the first `restrict` words,
a, b and c left out (3CosAdd); questions with a word outside those are not
asked, and the share asked is the coverage.

Both compare words case-insensitively, each lower-cased word standing for the
most frequent of its spellings, as gensim does by default. The three files ship
in gensim's wheel (`gensim/test/test_data`); `benchmark_file` finds them there.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnkit.embeddings.vectors import WordVectors
from attnkit.errors import AttnkitError
from attnkit.files import PathLike, read_lines

BENCHMARKS = {
    "wordsim353": "wordsim353.tsv",
    "simlex999": "simlex999.txt",
    "analogies": "questions-words.txt",
}
SEMANTIC_SECTIONS = 5  # the Google set's first five sections are semantic, the rest syntactic


@dataclass(frozen=True)
class SimilarityScore:
    spearman: float
    pearson: float
    pairs: int  # pairs scored
    total: int  # pairs in the file

    @property
    def coverage(self) -> float:
        return self.pairs / self.total


@dataclass(frozen=True)
class AnalogyScore:
    correct: int
    asked: int
    total: int
    sections: dict[str, tuple[int, int]]  # section -> (correct, asked)

    @property
    def accuracy(self) -> float:
        return self.correct / self.asked if self.asked else 0.0

    @property
    def coverage(self) -> float:
        return self.asked / self.total

    def part(self, semantic: bool) -> tuple[int, int]:
        """(correct, asked) over the semantic or the syntactic sections."""
        names = list(self.sections)
        chosen = names[:SEMANTIC_SECTIONS] if semantic else names[SEMANTIC_SECTIONS:]
        return sum(self.sections[n][0] for n in chosen), sum(self.sections[n][1] for n in chosen)


def benchmark_file(name: str) -> Path:
    """The file of a benchmark from gensim's wheel: "wordsim353", "simlex999" or "analogies"."""
    if name not in BENCHMARKS:
        raise AttnkitError(
            f"unknown word-vector benchmark {name!r}; choose one of {', '.join(BENCHMARKS)}."
        )
    spec = importlib.util.find_spec("gensim")
    if spec is None or spec.origin is None:
        raise AttnkitError(
            f"the {name} file ships with gensim, which attnkit's embed extra installs: "
            "pip install 'attnkit[embed]' (or gensim), or give the file's path."
        )
    return Path(spec.origin).parent / "test" / "test_data" / BENCHMARKS[name]


def word_similarity(
    vectors: WordVectors, path: PathLike, restrict: int = 300_000
) -> SimilarityScore:
    """Spearman and Pearson correlation of cosines with a "w1<TAB>w2<TAB>score" file's scores."""
    lookup = _lowercase_lookup(vectors, restrict)
    ours, theirs, total = [], [], 0
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) < 3:
            raise AttnkitError(
                f"{path}, line {number}: expected two words and a score separated by tabs."
            )
        total += 1
        a, b = lookup.get(fields[0].lower()), lookup.get(fields[1].lower())
        try:
            score = float(fields[2])
        except ValueError:
            raise AttnkitError(
                f"{path}, line {number}: the score {fields[2]!r} is not a number."
            ) from None
        if a is not None and b is not None:
            ours.append(float(vectors.unit[a] @ vectors.unit[b]))
            theirs.append(score)
    if len(ours) < 2:
        raise AttnkitError(f"the vectors know both words of fewer than two pairs of {path}.")
    x, y = torch.tensor(ours, dtype=torch.float64), torch.tensor(theirs, dtype=torch.float64)
    return SimilarityScore(_pearson(_ranks(x), _ranks(y)), _pearson(x, y), len(ours), total)


def analogies(
    vectors: WordVectors, path: PathLike, restrict: int = 300_000, chunk: int = 128
) -> AnalogyScore:
    """Accuracy on a questions-words file (": section" lines, then "a b c d" a line)."""
    lookup = _lowercase_lookup(vectors, restrict)
    sections: dict[str, list[list[int]]] = {}
    section, total = None, 0
    for number, line in enumerate(read_lines(path), start=1):
        if line.startswith(":"):
            section = line[1:].strip()
            sections.setdefault(section, [])
            continue
        words = line.lower().split()
        if not words:
            continue
        if section is None or len(words) != 4:
            raise AttnkitError(
                f'{path}, line {number}: expected four words after a ": section" line.'
            )
        total += 1
        ids = [lookup.get(w) for w in words]
        if None not in ids:
            sections[section].append(ids)  # type: ignore[arg-type]
    if total == 0:
        raise AttnkitError(f"{path} holds no analogy questions.")
    unit = vectors.unit[:restrict]
    # each row stands for its word's most frequent spelling, which the questions' ids are
    spelling = torch.tensor([lookup[w.lower()] for w in vectors.words[:restrict]], dtype=torch.long)
    scores = {
        name: (
            _answer(unit, spelling, torch.tensor(q, dtype=torch.long).view(-1, 4), chunk),
            len(q),
        )
        for name, q in sections.items()
    }
    correct = sum(c for c, _ in scores.values())
    return AnalogyScore(correct, sum(n for _, n in scores.values()), total, scores)


def _answer(unit: Tensor, spelling: Tensor, questions: Tensor, chunk: int) -> int:
    """How many questions have d as the word nearest to u_b - u_a + u_c, every spelling of
    a, b and c left out and any spelling of d right (gensim's case-blind comparison)."""
    correct = 0
    for rows in questions.split(chunk):
        a, b, c, d = rows.unbind(1)
        query = unit[b] - unit[a] + unit[c]
        scores = (query / query.norm(dim=1, keepdim=True).clamp_min(1e-12)) @ unit.T
        given = (spelling == a[:, None]) | (spelling == b[:, None]) | (spelling == c[:, None])
        scores.masked_fill_(given, -torch.inf)
        correct += int((spelling[scores.argmax(1)] == d).sum())
    return correct


def _lowercase_lookup(vectors: WordVectors, restrict: int) -> dict[str, int]:
    lookup: dict[str, int] = {}
    for i, word in enumerate(vectors.words[:restrict]):
        lookup.setdefault(word.lower(), i)  # the most frequent spelling stands for the word
    return lookup


def _ranks(x: Tensor) -> Tensor:
    """1-based ranks, tied values sharing their mean rank."""
    order = x.argsort()
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(1, len(x) + 1, dtype=x.dtype)
    values, inverse = x.unique(return_inverse=True)
    sums = torch.zeros(len(values), dtype=x.dtype).index_add_(0, inverse, ranks)
    counts = torch.zeros(len(values), dtype=x.dtype).index_add_(0, inverse, torch.ones_like(x))
    return (sums / counts)[inverse]


def _pearson(x: Tensor, y: Tensor) -> float:
    x, y = x - x.mean(), y - y.mean()
    return float((x @ y) / (x.norm() * y.norm()).clamp_min(1e-300))
