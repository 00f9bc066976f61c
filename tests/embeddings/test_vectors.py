"""Word vectors: their three file formats (and gensim reading ours), and the queries against
brute force."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from gensim.models import KeyedVectors

from attnkit.embeddings.vectors import WordVectors, load_vectors, save_vectors
from attnkit.errors import AttnkitError

WORDS = ["the", "king", "queen", "man", "woman", "prince", "Straße", "dog"]


def _vectors(dim: int = 6, seed: int = 0) -> WordVectors:
    torch.manual_seed(seed)
    return WordVectors(list(WORDS), torch.randn(len(WORDS), dim))


@pytest.mark.parametrize("binary", [False, True])
def test_our_files_round_trip_and_gensim_loads_them_with_the_same_values(
    tmp_path: Path, binary: bool
) -> None:
    vectors = _vectors()
    path = save_vectors(vectors, tmp_path / "v.bin", binary=binary)
    back = load_vectors(path)
    assert back.words == WORDS
    assert torch.equal(back.vectors, vectors.vectors)
    theirs = KeyedVectors.load_word2vec_format(str(path), binary=binary)
    assert theirs.index_to_key == WORDS
    assert np.array_equal(theirs.vectors, vectors.vectors.numpy())


@pytest.mark.parametrize("binary", [False, True])
def test_gensim_files_load(tmp_path: Path, binary: bool) -> None:
    theirs = KeyedVectors(vector_size=5)
    theirs.add_vectors(WORDS, np.random.default_rng(1).normal(size=(len(WORDS), 5)))
    theirs.save_word2vec_format(str(tmp_path / "g"), binary=binary)
    ours = load_vectors(tmp_path / "g")
    assert ours.words == WORDS
    assert torch.allclose(ours.vectors, torch.from_numpy(theirs.vectors), atol=1e-6)


def test_glove_text_without_header_and_words_with_spaces(tmp_path: Path) -> None:
    path = tmp_path / "glove.txt"
    path.write_text("the 0.5 -1 2\nnew york 1 2 3\n. 0 0 1e-3\n", encoding="utf-8")
    vectors = load_vectors(path)
    assert vectors.words == ["the", "new york", "."]
    assert vectors["new york"].tolist() == [1.0, 2.0, 3.0]
    assert load_vectors(path, limit=1).words == ["the"]
    assert load_vectors(path, format="glove").vectors.shape == (3, 3)


def test_a_limit_reads_the_first_words_of_every_format(tmp_path: Path) -> None:
    for binary in (False, True):
        path = save_vectors(_vectors(), tmp_path / f"v{binary}", binary=binary)
        assert load_vectors(path, limit=3).words == WORDS[:3]


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_similarity_nearest_and_analogy_equal_brute_force() -> None:
    vectors = _vectors(dim=4, seed=3)
    v = {w: vectors.vectors[i].double().numpy() for i, w in enumerate(WORDS)}
    assert vectors.similarity("king", "queen") == pytest.approx(
        _cos(v["king"], v["queen"]), abs=1e-6
    )

    by_cos = sorted((w for w in WORDS if w != "king"), key=lambda w: -_cos(v["king"], v[w]))
    assert [w for w, _ in vectors.nearest("king", k=3)] == by_cos[:3]

    unit = {w: x / np.linalg.norm(x) for w, x in v.items()}
    query = unit["king"] - unit["man"] + unit["woman"]
    expect = sorted(
        (w for w in WORDS if w not in ("king", "man", "woman")), key=lambda w: -_cos(query, v[w])
    )
    got = vectors.analogy("man", "king", "woman", k=2)
    assert [w for w, _ in got] == expect[:2]
    assert got[0][1] == pytest.approx(_cos(query, v[expect[0]]), abs=1e-6)


def test_nearest_to_a_vector_and_a_restricted_search() -> None:
    vectors = _vectors()
    assert vectors.nearest(vectors["dog"], k=1)[0][0] == "dog"
    assert all(w in WORDS[:3] for w, _ in vectors.nearest("dog", k=5, restrict=3))


def test_gensim_most_similar_agrees() -> None:
    vectors = _vectors(dim=5, seed=7)
    theirs = KeyedVectors(vector_size=5)
    theirs.add_vectors(WORDS, vectors.vectors.numpy())
    ours = vectors.most_similar(["king", "woman"], ["man"], k=3)
    expected = theirs.most_similar(positive=["king", "woman"], negative=["man"], topn=3)
    assert [w for w, _ in ours] == [w for w, _ in expected]
    assert [s for _, s in ours] == pytest.approx([s for _, s in expected], abs=1e-5)


def test_bad_input_says_what_is_wrong(tmp_path: Path) -> None:
    vectors = _vectors()
    with pytest.raises(AttnkitError, match="'emperor' is not among the 8 words"):
        vectors.similarity("king", "emperor")
    with pytest.raises(AttnkitError, match="white space"):
        save_vectors(WordVectors(["new york"], torch.zeros(1, 2)), tmp_path / "x")
    (tmp_path / "short.txt").write_text("2 3\nthe 1 2 3\nking 1 2\n", encoding="utf-8")
    with pytest.raises(AttnkitError, match="line 3: a word and 3 numbers expected, 3 found"):
        load_vectors(tmp_path / "short.txt")
    with pytest.raises(AttnkitError, match="no vector file"):
        load_vectors(tmp_path / "missing.txt")
    with pytest.raises(AttnkitError, match="unknown vector format"):
        load_vectors(tmp_path / "short.txt", format="fasttext")
    with pytest.raises(AttnkitError, match="one row per word"):
        WordVectors(["a", "b"], torch.zeros(3, 2))


@pytest.mark.parametrize("binary", [False, True])
def test_gzipped_files_load_as_the_plain_ones(tmp_path: Path, binary: bool) -> None:
    path = save_vectors(_vectors(), tmp_path / "v", binary=binary)
    zipped = tmp_path / "v.gz"
    zipped.write_bytes(gzip.compress(path.read_bytes()))
    back = load_vectors(zipped)
    assert back.words == WORDS and torch.equal(back.vectors, _vectors().vectors)


def test_a_binary_file_of_dimension_one_is_not_taken_for_text(tmp_path: Path) -> None:
    vectors = WordVectors(["a", "b"], torch.zeros(2, 1))
    path = save_vectors(vectors, tmp_path / "v.bin", binary=True)
    assert torch.equal(load_vectors(path).vectors, torch.zeros(2, 1))


def test_broken_files_say_what_is_wrong(tmp_path: Path) -> None:
    glove = tmp_path / "glove.txt"
    glove.write_text("the 1 2 3\ncat 4 5 6\n", encoding="utf-8")
    with pytest.raises(AttnkitError, match="does not begin with word2vec's header"):
        load_vectors(glove, format="word2vec")
    with pytest.raises(AttnkitError, match="does not begin with word2vec's header"):
        load_vectors(glove, format="word2vec-binary")
    (tmp_path / "nan.txt").write_text("the 1 x 3\n", encoding="utf-8")
    with pytest.raises(AttnkitError, match="line 1: the value 'x' is not a number"):
        load_vectors(tmp_path / "nan.txt")
    path = save_vectors(_vectors(), tmp_path / "v.bin", binary=True)
    cut = tmp_path / "cut.bin"
    cut.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(AttnkitError, match="ends after 7 of its 8 vectors"):
        load_vectors(cut)
    with pytest.raises(AttnkitError, match="limit on the words read must be 1 or more"):
        load_vectors(path, limit=0)
