"""attnkit distribution: the table's numbers are the output distributions of the run's model and
of a fresh one drawn from --seed, and the picture is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnkit.cli import main
from attnkit.models import build_model
from attnkit.output_distribution import target_distributions
from attnkit.run import load_run
from tests.helpers import tiny_run


def test_the_table_prints_p_and_the_loss_before_and_after(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = tiny_run(tmp_path / "lm", "decoder")
    png = tmp_path / "d.png"
    assert main(["distribution", str(folder), "a dog", str(png), "--seed", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    run = load_run(folder)
    torch.manual_seed(3)
    before = target_distributions(build_model(run.model.config), run.tokenizer, "a dog")
    after = target_distributions(run.model, run.tokenizer, "a dog")
    rows = [line.split() for line in lines[1:-2]]
    assert len(rows) == len(after.targets) == 4
    for t, row in enumerate(rows):
        numbers = [float(v) for v in row[-4:]]
        expected = [before.target_probs[t], after.target_probs[t]]
        expected += [before.losses[t], after.losses[t]]
        assert numbers == pytest.approx([float(v) for v in expected], abs=1e-4)
    mean = [float(v) for v in lines[-2].split()[1:]]
    assert mean == pytest.approx(
        [float(before.losses.mean()), float(after.losses.mean())], abs=1e-4
    )
    assert lines[-1] == f"wrote {png}" and png.stat().st_size > 0


def test_a_translation_run_without_a_source_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = tiny_run(tmp_path / "mt", "encoder-decoder")
    assert main(["distribution", str(folder), "a dog", str(tmp_path / "d.png")]) != 0
    assert "--source" in capsys.readouterr().err
