"""A run folder's neighbours and a folder attnkit did not make, each case named: the temporary
files cleaned on resume, a train.out_dir holding a user's files, a refused start's folder."""

import dataclasses

import pytest

from attnkit.cli import main
from attnkit.errors import AttnkitError
from attnkit.run import RunFolder
from attnkit.train import Trainer, tasks
from attnkit.train import checkpoint as ckpt
from attnkit.train.run_config import TrainSection
from bench.fault_injection import CONFIG
from tests.helpers import tiny_model, translation_batches

TWO_STEPS = dataclasses.replace(
    TrainSection(),
    steps=2,
    lr=3e-3,
    schedule="constant",
    warmup=0,
    save_every=2,
    threads=1,
)


def fit(out_dir, resume: bool = False) -> None:
    section = dataclasses.replace(TWO_STEPS, out_dir=str(out_dir))
    Trainer(tiny_model(), translation_batches(3), train=section).fit(resume=resume)


def test_resume_removes_only_the_temporary_files_of_attnkit_saves_not_the_users(tmp_path):
    fit(tmp_path)
    folder = RunFolder(tmp_path)
    cut = [
        folder.root / ".trainer_state.pt.k2j4x9q1.tmp",
        folder.step_dir(2) / ".model.safetensors.ab_9cd0e.tmp",
    ]
    users = [folder.root / ".x.tmp", folder.root / "sub" / ".notes.tmp"]
    users += [
        folder.root / "sub" / ".model.safetensors.k2j4x9q1.tmp",
        folder.root / "sub" / ".tmp0IQnAE",
        folder.root / ".tmpAbC123",  # safetensors' staging name, but not its bytes
    ]
    for path in cut + users:
        path.parent.mkdir(exist_ok=True)
        path.write_text("kept?")
    fit(tmp_path, resume=True)
    assert not any(path.exists() for path in cut)
    assert all(path.read_text() == "kept?" for path in users)


def test_a_folder_that_is_not_a_run_has_nothing_removed_as_a_cut_write(tmp_path):
    names = [".model.safetensors.k2j4x9q1.tmp", ".x.tmp"]
    for name in names:
        (tmp_path / name).write_text("mine")
    assert ckpt.remove_cut_writes(RunFolder(tmp_path)) == 0
    assert all((tmp_path / name).read_text() == "mine" for name in names)


def test_train_refuses_an_out_dir_holding_a_users_files_and_leaves_them(tmp_path):
    (tmp_path / "config.json").write_text("my own config")
    with pytest.raises(AttnkitError) as err:
        fit(tmp_path)
    assert str(err.value) == (
        f"train.out_dir {tmp_path} holds files that are not an attnkit run; "
        "choose an empty or new folder"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
    assert (tmp_path / "config.json").read_text() == "my own config"


def test_attnkit_train_refuses_a_users_folder_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tasks, "build_task", lambda config: pytest.fail("the task was built"))
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["train", str(config), "--set", f"train.out_dir={out}"]) == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert error.endswith("holds files that are not an attnkit run; choose an empty or new folder")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_a_run_killed_before_its_first_checkpoint_can_be_started_again(tmp_path):
    """What it leaves: the run config and metrics (and a fingerprint), no trainer state."""
    folder = RunFolder(tmp_path)
    folder.run_config.write_text("")
    folder.write_metrics()
    fit(tmp_path)
    assert ckpt.load_trainer_state(RunFolder(tmp_path))["step"] == 2


def test_a_refused_resume_leaves_no_empty_run_folder_behind(tmp_path):
    out = tmp_path / "runs" / "run"
    with pytest.raises(AttnkitError, match=r"no trainer_state\.pt to resume from"):
        fit(out, resume=True)
    assert list(tmp_path.iterdir()) == []
