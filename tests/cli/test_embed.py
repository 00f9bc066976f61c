"""attnkit embed: word vectors queried, scored, exported and drawn from the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnkit.cli import main
from attnkit.embeddings.vectors import WordVectors, load_vectors, save_vectors
from attnkit.run import RunFolder

WORDS = ["king", "queen", "man", "woman", "tiger", "cat", "old", "new", "athens", "greece"]


@pytest.fixture
def vectors(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    table = torch.randn(len(WORDS), 6)
    table[1] = table[0] - table[2] + table[3]  # queen = king - man + woman, exactly
    return save_vectors(WordVectors(WORDS, table), tmp_path / "v.txt")


def test_queries_print_words_and_scores(vectors: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["embed", "analogy", str(vectors), "man", "king", "woman", "-k", "2"]) == 0
    first = capsys.readouterr().out.splitlines()[0].split()
    assert first[1] == "queen" and float(first[0]) > 0.9
    assert main(["embed", "nearest", str(vectors), "king", "-k", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
    assert main(["embed", "similarity", str(vectors), "tiger", "tiger"]) == 0
    assert capsys.readouterr().out.strip() == "1.0000"


def test_eval_prints_the_three_scores_with_their_coverage(
    vectors: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["embed", "eval", str(vectors)]) == 0
    out = capsys.readouterr().out
    assert "WordSim-353  Spearman" in out and "of 353 pairs" in out
    assert "SimLex-999   Spearman" in out and "analogies    accuracy" in out
    assert "semantic" in out and "syntactic" in out


def test_export_reads_a_run_folder_and_writes_binary(
    tmp_path: Path, vectors: Path, capsys: pytest.CaptureFixture
) -> None:
    run = RunFolder(tmp_path / "run")
    run.root.mkdir()
    save_vectors(load_vectors(vectors), run.vectors, binary=True)
    out = tmp_path / "out.bin"
    assert main(["embed", "export", str(run.root), str(out), "--binary", "--limit", "4"]) == 0
    assert load_vectors(out).words == WORDS[:4]
    assert "wrote 4 vectors of dimension 6" in capsys.readouterr().out


def test_pictures_are_drawn(tmp_path: Path, vectors: Path) -> None:
    words = ["king", "queen", "cat"]
    assert main(["embed", "plot", str(vectors), str(tmp_path / "w.png"), *words]) == 0
    positions = ["--d-model", "16", "--length", "20"]
    assert main(["embed", "positions", str(tmp_path / "p.png"), *positions]) == 0
    assert (tmp_path / "w.png").stat().st_size > 1000 and (tmp_path / "p.png").stat().st_size > 1000


def test_strips_and_the_split_layout_reach_the_pictures(
    tmp_path: Path, vectors: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnkit import viz

    calls = []
    monkeypatch.setattr(viz, "plot_vector_strips", lambda *a, **k: calls.append((a, k)) or a[2])
    monkeypatch.setattr(viz, "plot_positional_encoding", lambda *a, **k: calls.append((a, k)))
    png = str(tmp_path / "s.png")
    assert main(["embed", "plot", str(vectors), png, "king", "--strips", "--dims", "4"]) == 0
    (loaded, words, path), options = calls[0]
    assert loaded.words == WORDS and words == ["king"] and path == png and options == {"dims": 4}
    split = ["--layout", "split", "--dims", "4", "5", "6", "7", "--length", "101"]
    assert main(["embed", "positions", png, *split]) == 0
    assert calls[1] == ((png, 128, 101), {"layout": "split", "dims": [4, 5, 6, 7]})


def test_mistakes_are_one_sentence(
    tmp_path: Path, vectors: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["embed", "nearest", str(vectors), "emperor"]) == 2
    assert "'emperor' is not among the 10 words" in capsys.readouterr().err
    assert main(["embed", "plot", str(vectors), str(tmp_path / "w.png"), "king", "cat"]) == 2
    assert "at least three words" in capsys.readouterr().err
    assert main(["embed", "positions", str(tmp_path / "p.png"), "--d-model", "7"]) == 2
    assert "even d_model" in capsys.readouterr().err
    assert main(["embed", "eval", str(tmp_path / "missing.txt")]) == 2
    assert "no vector file" in capsys.readouterr().err


def test_counts_must_be_positive(vectors: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["embed", "nearest", str(vectors), "king", "-k", "0"])
    assert "a whole number of 1 or more is needed, not '0'" in capsys.readouterr().err
