"""A folder that holds a trained model is never trained over without `--overwrite`: a run whose
trainer_state.pt was deleted (as users do once a run is done) is refused, not retrained from
scratch; `--overwrite` empties it of the earlier run (nothing stale stays) and refuses a folder
holding files attnkit did not write; a run killed before its first checkpoint starts again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attnkit import AttnkitError
from attnkit.cli import main
from attnkit.run import RunFolder
from attnkit.train import Trainer, new_run
from attnkit.train.run_config import TrainSection
from tests.helpers import cut_safetensors_save, tiny_model, translation_batches, translation_config


def contents(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A run trained through the command line (4 steps, checkpoints at 2 and 4, the best)."""
    root = tmp_path_factory.mktemp("finished")
    assert main(["train", translation_config(root)]) == 0
    return root / "run"


@pytest.fixture
def done(finished: Path, tmp_path: Path) -> tuple[str, Path]:
    """A copy of the finished run whose trainer_state.pt was deleted to save space, and its
    config."""
    config = translation_config(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "trainer_state.pt").unlink()
    return config, run


def test_a_trained_folder_without_its_trainer_state_is_not_trained_over(done, capsys):
    config, run = done
    before = contents(run)
    assert main(["train", config]) == 2
    err = capsys.readouterr().err
    assert (
        f"{run} holds a trained model (model.safetensors, checkpoints/best/model.safetensors, "
        "2 step checkpoints) but no trainer_state.pt to resume from; pass --overwrite"
    ) in err
    assert contents(run) == before
    assert main(["train", config, "--resume"]) == 2
    assert "has a trained model but no trainer_state.pt to resume from, so it cannot continue" in (
        capsys.readouterr().err
    )
    assert contents(run) == before


def test_overwrite_trains_a_new_run_in_its_place_leaving_nothing_stale(done):
    config, run = done
    stale = RunFolder(run).step_dir(9)
    shutil.copytree(RunFolder(run).step_dir(4), stale)  # a later step of the earlier run
    (run / "metrics.jsonl").write_text('{"step": 9, "train_loss": 0.1}\n')
    assert main(["train", config, "--overwrite"]) == 0
    assert RunFolder(run).saved_steps() == [2, 4]
    assert max(r["step"] for r in RunFolder(run).read_metrics()) == 4
    assert (run / "trainer_state.pt").is_file()


def test_overwrite_refuses_a_folder_with_files_attnkit_did_not_write(done, capsys):
    config, run = done
    (run / "notes.md").write_text("what I learned from this run")
    before = contents(run)
    assert main(["train", config, "--overwrite"]) == 2
    assert "holds notes.md, which attnkit did not write, so it will not replace" in (
        capsys.readouterr().err
    )
    assert contents(run) == before


def test_overwrite_and_resume_together_are_refused(done, capsys):
    config, run = done
    before = contents(run)
    assert main(["train", config, "--overwrite", "--resume"]) == 2
    assert "--resume continues the run in train.out_dir and --overwrite replaces it" in (
        capsys.readouterr().err
    )
    assert contents(run) == before


def test_the_trainer_alone_refuses_a_trained_folder_too(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "trainer_state.pt").unlink()
    trainer = Trainer(
        tiny_model(), translation_batches(2), train=TrainSection(out_dir=str(run), steps=1)
    )
    with pytest.raises(AttnkitError, match="holds a trained model"):
        trainer.fit()


def test_a_run_killed_before_its_first_checkpoint_starts_again(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run_config.toml").write_text("[train]\n")
    (run / "metrics.jsonl").write_text('{"step": 1, "train_loss": 3.0}\n')
    (run / "tokenizer.json").write_text("{}")
    new_run.check_new_run(RunFolder(run))  # no weights yet: nothing of worth to lose


def test_a_run_killed_inside_its_first_checkpoint_starts_again_whatever_the_save_staged(tmp_path):
    """Killed inside its first save, a run leaves the files the save staged: attnkit's own,
    and the one safetensors stages beneath it (`.tmpXXXXXX`); neither bars a new start."""
    folder = RunFolder(tmp_path / "run")
    folder.step_dir(1).mkdir(parents=True)
    folder.step_weights(1).write_bytes(b"a model")
    folder.run_config.write_text("[train]\n")
    (folder.root / ".model.safetensors.k2j4x9q1.tmp").write_bytes(b"half a model")
    cut_safetensors_save(folder.root / ".tmp0IQnAE")
    new_run.check_new_run(folder, lock_left=True)
    assert list(folder.root.iterdir()) == []


def test_a_start_killed_while_it_wrote_its_tokenizer_starts_again(tmp_path):
    folder = RunFolder(tmp_path / "run")
    folder.root.mkdir()
    folder.fingerprint.write_text("{}")
    (folder.root / f".{folder.tokenizer.name}.k2j4x9q1.tmp").write_text('{"half": ')
    new_run.check_new_run(folder, lock_left=True)
    (folder.root / ".tmpnotes1").write_text("a user's notes")  # a name alone is not enough
    with pytest.raises(AttnkitError, match="not an attnkit run"):
        new_run.check_new_run(folder, lock_left=True)
