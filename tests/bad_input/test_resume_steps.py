"""A resume never shortens a run behind its back (issue 53, POOR): `--resume --set
train.steps=100` on a run stopped at step 1,401 said "finished" and rewrote run_config.toml to
100 steps. A train.steps below the step the run stopped at is refused, the folder untouched."""

from __future__ import annotations

from pathlib import Path

from attnkit.cli import main
from tests.helpers import translation_config


def contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_resuming_with_fewer_steps_than_done_is_refused(tmp_path, capsys) -> None:
    config = translation_config(tmp_path)
    assert main(["train", config]) == 0  # 4 steps
    run = tmp_path / "run"
    before = contents(run)
    capsys.readouterr()
    assert main(["train", config, "--resume", "--set", "train.steps=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{run} stopped at step 4, past train.steps 2, so resuming would train nothing" in err
    assert "finished" not in err and err.count("\n") == 0
    assert contents(run) == before
    # Going on past where it stopped is still a resume.
    assert main(["train", config, "--resume", "--set", "train.steps=5"]) == 0
    assert "steps = 5" in (run / "run_config.toml").read_text()
