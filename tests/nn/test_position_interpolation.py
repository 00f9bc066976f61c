"""Position interpolation of sinusoidal positions (`positional_interpolation` s): position p
is read as p / s, so a model trained on L positions reads s L of them between its own."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from attnkit.cli import main
from attnkit.errors import AttnkitError
from attnkit.models import build_model
from attnkit.nn import sinusoidal_table
from attnkit.run import load_pretrained, save_pretrained
from tests.helpers import RUN_LINES, tiny_config, tiny_run


def test_the_table_reads_each_position_over_s() -> None:
    plain = sinusoidal_table(16, 8, dtype=torch.float64)
    halved = sinusoidal_table(32, 8, dtype=torch.float64, interpolation=2.0)
    # Even rows are the trained positions; odd rows lie halfway between two of them.
    torch.testing.assert_close(halved[0::2], plain)
    p, i = 3.5, torch.arange(4, dtype=torch.float64)
    angle = p / 10000.0 ** (2 * i / 8)
    by_hand = torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1).flatten()
    torch.testing.assert_close(halved[7], by_hand)


def test_a_loaded_run_reads_twice_its_length_inside_the_trained_positions(tmp_path: Path) -> None:
    torch.manual_seed(0)
    config = tiny_config("decoder", positional="sinusoidal", dropout=0.0, embedding_dropout=0.0)
    save_pretrained(build_model(config), tmp_path / "run")  # max_len 32
    trained = load_pretrained(tmp_path / "run")
    read = load_pretrained(
        tmp_path / "run", overrides={"max_len": 64, "positional_interpolation": 2.0}
    )
    assert read.config.positional_interpolation == 2.0
    torch.testing.assert_close(read.embed.positions.table[0::2], trained.embed.positions.table)
    ids = torch.randint(0, config.vocab_size, (1, 64))
    with torch.no_grad():
        logits = read(ids).logits
        assert logits.shape[1] == 64 and torch.isfinite(logits).all()
        # Position 0 is 0 / s: the first token's prediction is the trained model's.
        torch.testing.assert_close(logits[:, 0], trained(ids[:, :1]).logits[:, 0])
        assert not torch.allclose(logits[:, :32], trained(ids[:, :32]).logits)


def test_eval_sets_it_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tiny_run(tmp_path / "run", "decoder", max_len=24, positional="sinusoidal")
    (tmp_path / "data" / "tinyshakespeare").mkdir(parents=True)
    (tmp_path / "data" / "tinyshakespeare" / "input.txt").write_text(" ".join(RUN_LINES) * 20)
    args = ["eval", str(run), "--corpus", "tinyshakespeare", "--split", "val", "--no-progress"]
    args += ["--data-dir", str(tmp_path / "data"), "--block-size", "48"]
    args += ["--set", "model.max_len=48"]
    losses = []
    for extra in ([], ["--set", "model.positional_interpolation=2"]):
        assert main([*args, *extra]) == 0
        line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("loss"))
        losses.append(float(line.split()[1]))
    # Extrapolated (positions 24..47 unseen) and interpolated (0, 0.5, ..., 23.5) differ.
    assert losses[0] != losses[1]


@pytest.mark.parametrize(
    "changes",
    [
        {"positional_interpolation": 0.0},
        {"positional_interpolation": -2.0},
        {"positional_interpolation": math.nan},
        {"positional_interpolation": 2.0, "positional": "learned"},
        {"positional_interpolation": 2.0, "positional": "rope"},
    ],
)
def test_it_outside_sinusoidal_positions_is_refused(changes: dict) -> None:
    with pytest.raises(AttnkitError, match=r"positional_interpolation|finite"):
        tiny_config("decoder", **changes)
