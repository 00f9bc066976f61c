"""No command writes over one of its own inputs, and a write keeps what the path is: an output
that is the input (by name, by a link, as standard input) is refused before any work; a
symbolic link's target is replaced and the link kept; a FIFO or an open descriptor is written
in place, never renamed over."""

from __future__ import annotations

import os
import stat
import sys
import threading
from pathlib import Path

import pytest
import torch

from attnkit import AttnkitError
from attnkit.cli import main
from attnkit.embeddings.vectors import WordVectors, load_vectors, save_vectors
from attnkit.files import atomic_write, check_writable
from tests.helpers import tiny_run

posix = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and /dev/fd are POSIX's")


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    path = tmp_path / "in.txt"
    path.write_text("ein hund läuft\nthe cat sleeps\n")
    return path


@pytest.fixture
def vectors_file(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    words = [f"w{i}" for i in range(40)]
    return save_vectors(WordVectors(words, torch.randn(40, 4)), tmp_path / "v.txt")


def test_translate_refuses_to_write_its_input_file(tmp_path, sources, capsys):
    run = tiny_run(tmp_path / "run", "encoder-decoder")
    before = sources.read_bytes()
    args = ["translate", str(run), "--input", str(sources), "--no-progress"]
    assert main([*args, "--output", str(sources)]) == 2
    assert (
        f"--output {sources} is also the input (--input): writing it would destroy what the "
        "command reads; choose another path"
    ) in capsys.readouterr().err
    link = tmp_path / "link.txt"
    link.symlink_to(sources)
    assert main([*args, "--output", str(link)]) == 2  # the same file under another name
    assert "is also the input (--input)" in capsys.readouterr().err
    assert sources.read_bytes() == before


def test_translate_refuses_to_write_the_file_standard_input_reads(
    tmp_path, sources, capsys, monkeypatch
):
    run = tiny_run(tmp_path / "run", "encoder-decoder")
    before = sources.read_bytes()
    with sources.open() as stdin:  # `attnkit translate RUN --output F < F`
        monkeypatch.setattr(sys, "stdin", stdin)
        code = main(["translate", str(run), "--output", str(sources), "--no-progress"])
    assert code == 2
    assert "is also the input (standard input)" in capsys.readouterr().err
    assert sources.read_bytes() == before


def test_translate_refuses_to_write_over_a_file_of_its_run_folder(tmp_path, sources, capsys):
    run = tiny_run(tmp_path / "run", "encoder-decoder")
    tokenizer = run / "tokenizer.json"
    before = tokenizer.read_bytes()
    args = ["translate", str(run), "--input", str(sources), "--no-progress"]
    assert main([*args, "--output", str(tokenizer)]) == 2
    assert f"is also the input (tokenizer.json of {run})" in capsys.readouterr().err
    assert tokenizer.read_bytes() == before
    # A file of its own beside the run's files is the user's to write, again and again.
    for _ in range(2):
        assert main([*args, "--output", str(run / "hypotheses.txt")]) == 0
    assert len((run / "hypotheses.txt").read_text().splitlines()) == 2


def test_embed_export_refuses_to_write_its_vectors_file(vectors_file, capsys):
    before = vectors_file.read_bytes()
    code = main(["embed", "export", str(vectors_file), str(vectors_file), "--limit", "10"])
    assert code == 2
    assert "OUT" in capsys.readouterr().err
    assert vectors_file.read_bytes() == before
    assert len(load_vectors(vectors_file)) == 40


def test_embed_plot_refuses_a_picture_path_that_is_its_vectors_file(vectors_file, capsys):
    before = vectors_file.read_bytes()
    png = vectors_file.with_suffix(".png")
    png.symlink_to(vectors_file)
    assert main(["embed", "plot", str(vectors_file), str(png), "w1", "w2", "w3"]) == 2
    assert "is also the input (VECTORS)" in capsys.readouterr().err
    assert vectors_file.read_bytes() == before


def test_check_writable_refuses_a_hard_link_to_an_input(tmp_path, sources):
    twin = tmp_path / "twin.txt"
    os.link(sources, twin)
    with pytest.raises(AttnkitError, match=r"--output .*twin.txt is also the input \(--input\)"):
        check_writable(twin, "--output", inputs=[("--input", sources)])
    assert check_writable(tmp_path / "new.txt", "--output", inputs=[("--input", sources)])


def test_a_write_through_a_symbolic_link_replaces_its_target_and_keeps_the_link(tmp_path):
    target = tmp_path / "data" / "translations.txt"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "latest.txt"
    link.symlink_to(target)
    atomic_write(link, lambda p: p.write_text("new\n"))
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "latest.txt"]


@posix
def test_a_write_to_a_fifo_goes_through_it_and_leaves_the_fifo(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    atomic_write(fifo, lambda p: p.write_text("through the pipe\n"))
    reader.join(timeout=10)
    assert got == [b"through the pipe\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # not replaced by a regular file


@posix
@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="needs /dev/fd")
def test_a_write_to_an_open_descriptor_goes_to_that_descriptor(tmp_path):
    # /dev/stdout is /dev/fd/1 by another name: what the shell redirected it to is written.
    out = tmp_path / "redirected.txt"
    with out.open("w") as held:
        descriptor = Path(f"/dev/fd/{held.fileno()}")
        atomic_write(descriptor, lambda p: p.write_text("to the descriptor\n"))
    assert out.read_text() == "to the descriptor\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["redirected.txt"]


def test_a_write_to_a_folder_is_one_sentence(tmp_path):
    with pytest.raises(AttnkitError, match=r"is a folder, so no file can be written there"):
        atomic_write(tmp_path, lambda p: p.write_text("x"))


@pytest.fixture
def corpus_folder(tmp_path: Path) -> Path:
    """A corpus given as a folder: plain sources, gzipped references."""
    import gzip

    folder = tmp_path / "corp"
    folder.mkdir()
    (folder / "val.de").write_text("ein hund\neine katze\n")
    with gzip.open(folder / "val.en.gz", "wt") as f:
        f.write("a dog\na cat\n")
    return folder


@pytest.mark.parametrize("name", ["val.en.gz", "val.de", "val.en"])
def test_eval_refuses_to_write_over_the_corpus_it_scores(
    mt_run, corpus_folder, name, capsys
) -> None:
    before = {p.name: p.read_bytes() for p in corpus_folder.iterdir()}
    output = corpus_folder / name
    args = ["eval", str(mt_run), "--corpus", str(corpus_folder), "--split", "val"]
    args += ["--src-lang", "de", "--tgt-lang", "en", "--max-new-tokens", "2"]
    assert main([*args, "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert f"--output {output} is also the input (the " in err
    assert "writing it would destroy what the command reads; choose another path" in err
    assert {p.name: p.read_bytes() for p in corpus_folder.iterdir()} == before
    assert main([*args, "--output", str(corpus_folder / "hypotheses.txt")]) == 0


def test_eval_refuses_to_write_over_a_known_corpus_file(mt_run, tmp_path, data_dir, capsys):
    import shutil

    mine = tmp_path / "data" / "multi30k"
    mine.mkdir(parents=True)
    for name in ("val.de.gz", "val.en.gz"):
        shutil.copy(data_dir / "multi30k" / name, mine / name)
    before = (mine / "val.en.gz").read_bytes()
    args = ["eval", str(mt_run), "--corpus", "multi30k", "--split", "val", "--limit", "2"]
    args += ["--data-dir", str(tmp_path / "data"), "--max-new-tokens", "2"]
    assert main([*args, "--output", str(mine / "val.en.gz")]) == 2
    err = capsys.readouterr().err
    assert "is also the input (the references of multi30k" in err
    assert (mine / "val.en.gz").read_bytes() == before
