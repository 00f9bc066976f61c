"""The amplitude of absolute positions (`positional_scale`) and the distinctness of the
sinusoidal codes (every position up to max_len has its own)."""

import logging
import math

import pytest
import torch

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.nn import sinusoidal_table
from tests.helpers import tiny_config, tiny_model


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
@pytest.mark.parametrize("combine", ["add", "concat"])
def test_positional_scale_multiplies_the_position_vectors(positional: str, combine: str) -> None:
    ids = torch.tensor([[3, 5, 7, 9, 11]])
    changes = {"shape": "decoder", "positional": positional, "positional_combine": combine}
    plain = tiny_model(**changes, embedding_dropout=0.0).eval()
    scaled = tiny_model(**changes, embedding_dropout=0.0, positional_scale=0.25).eval()
    table = plain.embed.positions.table[:5]
    token = plain.embed.token(ids)
    if combine == "add":
        torch.testing.assert_close(plain.embed(ids), token + table)
        torch.testing.assert_close(scaled.embed(ids), token + 0.25 * table)
    else:  # [E x; a PE] W_c: the same projection reads the scaled vectors
        torch.testing.assert_close(scaled.embed(ids), plain.embed.combine(token, 0.25 * table))


def test_positional_scale_is_saved_and_read_back() -> None:
    config = tiny_config("decoder", positional_scale=2.0)
    assert ModelConfig.from_json(config.to_json()).positional_scale == 2.0


@pytest.mark.parametrize(
    "changes",
    [
        {"positional_scale": 0.0},
        {"positional_scale": -1.0},
        {"positional_scale": float("nan")},
        {"positional_scale": 2.0, "positional": "rope"},
        {"positional_scale": 2.0, "positional": "none"},
    ],
)
def test_positional_scale_outside_absolute_positions_is_refused(changes: dict) -> None:
    with pytest.raises(AttnkitError, match=r"positional_scale|finite"):
        tiny_config("decoder", **changes)


@pytest.mark.parametrize(("d_model", "max_len"), [(512, 1024), (64, 1024), (16, 1024), (8, 512)])
def test_every_sinusoidal_code_is_distinct_up_to_max_len(d_model: int, max_len: int) -> None:
    """No two positions p != q < max_len share a code: min ||PE(p) - PE(q)|| > 0.

    ||PE(p) - PE(q)||^2 = sum_i 2 - 2 cos((p - q) w_i) depends on p - q alone, so the pairwise
    minimum is also the minimum over offsets k = 1..max_len-1 (asserted, as a second reading).
    """
    table = sinusoidal_table(max_len, d_model, dtype=torch.float64)
    distances = torch.cdist(table, table)
    distances.fill_diagonal_(float("inf"))
    smallest = float(distances.min())
    omega = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float64) * -(math.log(10000.0) / d_model)
    )
    k = torch.arange(1, max_len, dtype=torch.float64)[:, None]
    by_offset = (2 - 2 * torch.cos(k * omega)).sum(-1).sqrt()
    assert smallest == pytest.approx(float(by_offset.min()), rel=1e-9)
    logging.getLogger(__name__).info(
        "d_model %d, max_len %d: min distance %.4f", d_model, max_len, smallest
    )
    assert smallest > 0.5  # far from float rounding: 3.714 at d_model 512, 1.015 at 16
