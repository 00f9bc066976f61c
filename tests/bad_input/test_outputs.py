"""Outputs under bad conditions: `--overwrite` replaces only what attnkit writes in a folder,
an output path is tested by a real write before any decoding, `--output` is written whole or
not at all, and a damaged pytorch_model.bin is one sentence without torch's advice."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import pytest
import torch

from attnkit import AttnkitError
from attnkit.cli import main
from attnkit.files import check_writable
from attnkit.interop import export_hf, import_hf, load_hf
from attnkit.run import load_pretrained
from tests.helpers import RUN_LINES

on_linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


def test_overwrite_removes_the_stale_trainer_state_and_tokenizer_of_an_earlier_run(
    hf_folder, tmp_path
):
    run = tmp_path / "run"
    import_hf(hf_folder, run)
    for name in ("trainer_state.pt", "run_config.toml", "metrics.jsonl", "train.lock"):
        (run / name).write_text("of the earlier run")
    (run / "checkpoints" / "step-0000500").mkdir(parents=True)
    (run / ".new-abc.tmp").mkdir()  # left by an import that was killed
    (hf_folder / "tokenizer.json").unlink()
    import_hf(hf_folder, run, overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "model.safetensors"]
    assert load_pretrained(run).config == load_hf(hf_folder).model.config


def test_overwrite_refuses_a_hugging_face_clone_and_keeps_its_git_and_readme(
    hf_folder, tmp_path, capsys
):
    run = tmp_path / "run"
    import_hf(hf_folder, run)
    (hf_folder / ".git").mkdir()
    (hf_folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (hf_folder / "README.md").write_text("# the model card\n")
    before = {p.name for p in hf_folder.iterdir()}
    assert main(["export", "hf", str(run), str(hf_folder), "--overwrite"]) == 2
    assert (
        f"{hf_folder} holds .git, README.md, which attnkit did not write, so it will not replace "
        "that folder, even with --overwrite; move them away or choose another folder"
    ) in capsys.readouterr().err
    assert {p.name for p in hf_folder.iterdir()} == before
    assert (hf_folder / ".git" / "HEAD").is_file()
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / "config.json").write_text("{}")
    (clone / "generation_config.json").write_text("{}")
    with pytest.raises(AttnkitError, match=r"holds generation_config\.json, which attnkit did not"):
        import_hf(hf_folder, clone, overwrite=True)
    assert (clone / "generation_config.json").is_file()
    export_hf(run, tmp_path / "export")
    export_hf(run, tmp_path / "export", overwrite=True)  # an earlier export is replaced


@on_linux
@pytest.mark.parametrize("option", ["--output", "--attention-plot"])
def test_an_output_in_proc_is_refused_before_decoding_even_for_root(
    mt_run, tmp_path, capsys, monkeypatch, option
):
    def fail(*args, **kwargs):
        raise AssertionError("decoding ran before the output path was checked")

    monkeypatch.setattr("attnkit.inference.translate", fail)
    source = tmp_path / "in.txt"
    source.write_text(RUN_LINES[0] + "\n")
    assert main(["translate", str(mt_run), "--input", str(source), option, "/proc/x.txt"]) == 2
    err = capsys.readouterr().err
    assert f"{option} /proc/x.txt cannot be written: no file can be made in /proc; choose" in err
    assert "Traceback" not in err


def test_check_writable_leaves_no_file_behind_and_accepts_a_device(tmp_path):
    check_writable(tmp_path / "new" / "out.txt", "--output")
    assert list(tmp_path.iterdir()) == []
    check_writable(os.devnull, "--output")


def test_translate_output_on_a_full_disk_is_one_sentence_and_leaves_the_old_file(
    mt_run, tmp_path, capsys, monkeypatch
):
    source = tmp_path / "in.txt"
    source.write_text(RUN_LINES[0] + "\n")
    output = tmp_path / "out.txt"
    output.write_text("the translations of yesterday\n")

    def full_disk(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", full_disk)
    args = ["translate", str(mt_run), "--input", str(source), "--max-new-tokens", "2"]
    assert main([*args, "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert (
        f"could not write {output} (No space left on device); its previous version is intact"
    ) in err
    monkeypatch.undo()
    assert output.read_text() == "the translations of yesterday\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_translate_output_to_a_device_is_written_in_place(mt_run, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text(RUN_LINES[0] + "\n")
    args = ["translate", str(mt_run), "--input", str(source), "--max-new-tokens", "2"]
    assert main([*args, "--output", os.devnull]) == 0
    assert Path(os.devnull).exists() and not Path(os.devnull).is_file()


@pytest.mark.parametrize("length", [1, 18, 151, 346])
def test_a_truncated_pytorch_model_bin_is_damaged_without_torchs_weights_only_advice(
    hf_folder, tmp_path, length
):
    """Cut at 1, 18, 151 and 346 bytes, torch fails with IndexError, struct.error, its
    weights_only advice and a RuntimeError."""
    state = load_hf(hf_folder).model.state_dict()
    whole = tmp_path / "whole.bin"
    torch.save(state, whole, _use_new_zipfile_serialization=False)
    (hf_folder / "model.safetensors").unlink()
    (hf_folder / "pytorch_model.bin").write_bytes(whole.read_bytes()[:length])
    with pytest.raises(AttnkitError) as err:
        load_hf(hf_folder)
    assert "weights_only" not in str(err.value)
    assert str(err.value).startswith(f"pytorch_model.bin in {hf_folder} ")
    if length != 151:  # cut inside a class name, which then reads as a Python object
        assert str(err.value).endswith(
            "is damaged or not a PyTorch weights file; download it again"
        )
