"""Word-similarity and analogy scores against gensim's, on its own benchmark files."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gensim.models import KeyedVectors

from attnkit.embeddings.evaluation import (
    _ranks,
    analogies,
    benchmark_file,
    word_similarity,
)
from attnkit.embeddings.vectors import WordVectors
from attnkit.errors import AttnkitError


def _both(words: list[str], dim: int = 8, seed: int = 0) -> tuple[WordVectors, KeyedVectors]:
    vectors = np.random.default_rng(seed).normal(size=(len(words), dim)).astype(np.float32)
    theirs = KeyedVectors(vector_size=dim)
    theirs.add_vectors(words, vectors)
    return WordVectors(words, torch.from_numpy(vectors)), theirs


def _words(path: Path, columns: slice) -> list[str]:
    seen: dict[str, None] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line and line[0] not in "#:":
            seen.update(dict.fromkeys(line.replace("\t", " ").split()[columns]))
    return list(seen)


@pytest.mark.parametrize("name", ["wordsim353", "simlex999"])
def test_word_similarity_equals_gensim(name: str) -> None:
    path = benchmark_file(name)
    words = _words(path, slice(0, 2))
    ours, theirs = _both([*words[::2], "Tiger"])  # half the words known, one by another case
    score = word_similarity(ours, path)
    pearson, spearman, oov = theirs.evaluate_word_pairs(str(path))
    assert score.spearman == pytest.approx(spearman.statistic, abs=1e-6)
    assert score.pearson == pytest.approx(pearson.statistic, abs=1e-6)
    assert 100 * (1 - score.coverage) == pytest.approx(oov)


def test_analogies_equal_gensim_section_by_section(tmp_path: Path) -> None:
    lines = benchmark_file("analogies").read_text(encoding="utf-8").splitlines()
    sections = [i for i, line in enumerate(lines) if line.startswith(":")]
    # two semantic sections and one syntactic, 60 questions each
    keep = [i for s in (sections[0], sections[1], sections[6]) for i in range(s, s + 61)]
    path = tmp_path / "questions.txt"
    path.write_text("\n".join(lines[i] for i in keep) + "\n", encoding="utf-8")
    words = _words(path, slice(0, 4))
    ours, theirs = _both(words[:-5], dim=3)  # low-dimensional so some answers are right
    # plant one exact analogy: b - a + c lands on d
    a, b, c, d = (ours.index[w] for w in lines[keep[1]].split())
    ours.vectors[d] = ours.unit[b] - ours.unit[a] + ours.unit[c]
    theirs.vectors[d] = ours.vectors[d].numpy()
    theirs.fill_norms(force=True)
    ours = WordVectors(ours.words, ours.vectors)  # a new object: its unit vectors are made anew

    score = analogies(ours, path)
    total, graded = theirs.evaluate_word_analogies(str(path))
    assert score.total == 180
    assert score.correct == len(graded[-1]["correct"]) > 0
    assert score.asked == len(graded[-1]["correct"]) + len(graded[-1]["incorrect"]) < 180
    assert score.accuracy == pytest.approx(total)
    for section in graded[:-1]:
        assert score.sections[section["section"]] == (
            len(section["correct"]),
            len(section["correct"]) + len(section["incorrect"]),
        )
    semantic = score.part(semantic=True)
    assert semantic[1] + score.part(semantic=False)[1] == score.asked


def test_ranks_share_ties() -> None:
    assert _ranks(torch.tensor([3.0, 1.0, 2.0, 2.0])).tolist() == [4.0, 1.0, 2.5, 2.5]


def test_unknown_benchmarks_and_files_say_so(tmp_path: Path) -> None:
    with pytest.raises(AttnkitError, match="unknown word-vector benchmark"):
        benchmark_file("men3000")
    (tmp_path / "pairs.txt").write_text("cat dog 3\n", encoding="utf-8")
    ours, _ = _both(["cat", "dog"])
    with pytest.raises(AttnkitError, match="line 1: expected two words and a score"):
        word_similarity(ours, tmp_path / "pairs.txt")
    (tmp_path / "q.txt").write_text("a b c d\n", encoding="utf-8")
    with pytest.raises(AttnkitError, match='after a ": section" line'):
        analogies(ours, tmp_path / "q.txt")


def test_analogies_compare_spellings_as_gensim_does(tmp_path: Path) -> None:
    # "Iraq" is the frequent spelling, "iraq" the one nearest to the answer; "GREECE", a
    # spelling of a question's word, is nearer still and must be passed over
    words = ["athens", "greece", "baghdad", "Iraq", "GREECE", "iraq", "cairo", "egypt"]
    torch.manual_seed(0)
    table = torch.randn(len(words), 6)
    target = table[1] - table[0] + table[2]
    table[4] = target * 1.0
    table[5] = target + 0.01 * torch.randn(6)
    path = tmp_path / "questions.txt"
    path.write_text(": capital\nAthens Greece Baghdad Iraq\nAthens Greece Cairo Egypt\n")
    ours = WordVectors(words, table)
    theirs = KeyedVectors(vector_size=6)
    theirs.add_vectors(words, table.numpy())
    score = analogies(ours, path)
    accuracy, graded = theirs.evaluate_word_analogies(str(path))
    assert (score.correct, score.asked) == (len(graded[-1]["correct"]), 2)
    assert score.correct >= 1 and score.accuracy == pytest.approx(accuracy)


def test_a_score_that_is_not_a_number_is_named(tmp_path: Path) -> None:
    (tmp_path / "pairs.txt").write_text("cat\tdog\thigh\n", encoding="utf-8")
    ours, _ = _both(["cat", "dog"])
    with pytest.raises(AttnkitError, match="line 1: the score 'high' is not a number"):
        word_similarity(ours, tmp_path / "pairs.txt")


def test_without_gensim_the_benchmarks_name_the_embed_extra(monkeypatch) -> None:
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "gensim" else found(name, *args),
    )
    with pytest.raises(AttnkitError, match=r"pip install 'attnkit\[embed\]' \(or gensim\)"):
        benchmark_file("wordsim353")


def test_the_embed_extra_brings_gensim_and_dev_brings_the_extra() -> None:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib

    root = Path(__file__).parents[2]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    extras = extras["optional-dependencies"]
    assert any(r.startswith("gensim") for r in extras["embed"])
    assert "embed" in extras["dev"][0].split("[")[1]
