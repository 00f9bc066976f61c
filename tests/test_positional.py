"""Positional encodings against the paper's formula, computed independently."""

import math

import torch

from attnkit.nn import AbsolutePositions, sinusoidal_table


def test_sinusoidal_table_is_the_papers_formula() -> None:
    max_len, d = 50, 16
    table = sinusoidal_table(max_len, d)
    for pos in range(max_len):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert math.isclose(table[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(table[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-6)


def test_sinusoidal_positions_are_fixed_and_not_saved() -> None:
    positions = AbsolutePositions(32, 8, learned=False)
    assert list(positions.parameters()) == []
    assert positions.state_dict() == {}


def test_explicit_positions_index_the_table() -> None:
    positions = AbsolutePositions(32, 8, learned=True)
    x = torch.zeros(2, 3, 8)
    shifted = positions(x, torch.tensor([[0, 1, 2], [5, 6, 7]]))
    torch.testing.assert_close(shifted[0], positions.table[:3])
    torch.testing.assert_close(shifted[1], positions.table[5:8])
    torch.testing.assert_close(positions(x), positions.table[:3].expand(2, 3, 8))
