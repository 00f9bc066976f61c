"""A picture's memory is bounded before it is drawn (issue 53, BAD 5): `attnkit embed positions
--length 3000000` was killed by the kernel after 22 GB with no message, and a wide `--d-model`
reached the catch-all sentence. Past `POSITION_PICTURE_CELLS` positions x dimensions the
picture is refused in one sentence, before any table is made."""

from __future__ import annotations

import pytest

from attnkit import viz
from attnkit.cli import main


@pytest.fixture
def nothing_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Making the table fails the test: a refusal must come before it."""

    def drawn(*args, **kwargs):
        raise AssertionError("the table was made")

    monkeypatch.setattr(viz, "sinusoidal_table", drawn)


@pytest.mark.parametrize(
    ("size", "cells"),
    [(["--length", "3000000"], "384,000,000"), (["--d-model", "100000000"], "10,000,000,000")],
    ids=["long", "wide"],
)
def test_a_picture_past_its_bound_is_one_sentence(tmp_path, nothing_drawn, size, cells, capsys):
    assert main(["embed", "positions", str(tmp_path / "p.png"), *size]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "did not expect" not in err
    assert f"has {cells} cells, more than the 1,000,000 one draws" in err
    assert "give a smaller --length or --d-model" in err
    assert not (tmp_path / "p.png").exists()


def test_a_picture_at_its_bound_is_drawn(tmp_path) -> None:
    length = viz.POSITION_PICTURE_CELLS // 16
    assert viz.plot_positional_encoding(tmp_path / "p.png", 16, length).is_file()
