"""int8 linear layers: quantization, the bound against float32, and every path giving the
same bits (the C kernel's builds, torch's `_int_mm`, FBGEMM), alone or in any batch."""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import AttnkitError
from attnkit.kernels import int8_rows
from attnkit.kernels.cpu import this_cpu
from attnkit.nn.embedding import TokenEmbedding
from attnkit.nn.int8_linear import (
    Int8Embedding,
    Int8Linear,
    Int8Path,
    dequantize,
    int8_path,
    quantize_per_channel,
)
from attnkit.nn.linear import Linear

VNNI = this_cpu().has("avx512_vnni")
FBGEMM = "fbgemm" in torch.backends.quantized.supported_engines
# Every many-row product this CPU runs exactly: `_int_mm` only with VNNI (without it torch
# 2.13's saturates), FBGEMM on 7-bit rows wherever torch has it.
MANY = [("int_mm", 127)] * VNNI + [("fbgemm", 63)] * FBGEMM
KERNELS = [*int8_rows.runnable(), None]  # None: the many-row product for every call
PATHS = [Int8Path(kernel, many, levels) for kernel in KERNELS for many, levels in MANY]
needs_a_path = pytest.mark.skipif(
    not MANY, reason="this CPU has neither AVX512-VNNI nor torch's FBGEMM kernels"
)


def test_quantize_dequantize_round_trip_is_exact_on_representable_weights():
    q = torch.randint(-127, 128, (12, 40), dtype=torch.int8)
    q[:, 0] = 127  # each row reaches the top of the range, so its scale is the one chosen
    scale = torch.rand(12) + 0.01
    again, scale_again = quantize_per_channel(dequantize(q, scale))
    assert torch.equal(again, q)
    torch.testing.assert_close(scale_again, scale, rtol=1e-6, atol=0)


def test_quantization_error_is_at_most_half_a_step_per_weight():
    weight = torch.randn(30, 50)
    weight[3] = 0.0  # an all-zero row stays exactly zero
    q, scale = quantize_per_channel(weight)
    error = (dequantize(q, scale) - weight).abs()
    assert (error <= scale[:, None] / 2 * (1 + 1e-6)).all()
    assert (dequantize(q, scale)[3] == 0).all()


@needs_a_path
@pytest.mark.parametrize("path", PATHS, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_is_within_the_quantization_bound_of_float32(bias: bool, path: Int8Path):
    linear = Linear(64, 48, bias=bias)
    layer = Int8Linear(linear, path)
    x = torch.randn(2, 9, 64) * torch.logspace(-2, 2, 9)[:, None]  # rows of very different size
    with torch.no_grad():
        exact, int8 = linear(x), layer(x)
    # Each row on its own scale (peak |x_r| / Q), each weight within half its step:
    # |error| <= sum_i |x_i| ds_w / 2 + |w_i| ds_x / 2 + ds_w ds_x / 4.
    _, w_step = quantize_per_channel(linear.weight)
    x_step = x.abs().amax(-1, keepdim=True) / path.levels
    bound = (
        x.abs().sum(-1, keepdim=True) * w_step / 2
        + linear.weight.abs().sum(-1) * x_step / 2
        + 64 * w_step * x_step / 4
    )
    assert ((int8 - exact).abs() <= bound * 1.01 + 1e-6).all()
    # And, on typical rows, per output channel: relative error under 2.5% (8 bits) or 5% (7).
    rows = torch.randn(256, 64)
    with torch.no_grad():
        y, y8 = linear(rows), layer(rows)
    limit = 0.025 if path.levels == 127 else 0.05
    assert ((y8 - y).norm(dim=0) / y.norm(dim=0)).max() < limit


@needs_a_path
@pytest.mark.parametrize("path", PATHS, ids=str)
@pytest.mark.parametrize(("in_features", "out_features"), [(64, 24), (100, 7), (512, 96)])
def test_a_row_gives_the_same_bits_alone_in_any_batch_and_on_every_path(
    path: Int8Path, in_features: int, out_features: int
):
    """Rows of few-row calls (the kernel) against the same rows in one call of 40 (the
    many-row product); with sizes off the kernel's 16 and 64 byte steps, and a zero row."""
    layer = Int8Linear(Linear(in_features, out_features), path)
    x = torch.randn(40, in_features) * torch.logspace(-3, 3, 40)[:, None]
    x[5] = 0.0
    with torch.no_grad():
        together = layer(x)
        for rows in (1, 3, 8, int8_rows.KERNEL_ROWS):
            for start in (0, 5, 40 - rows):
                assert torch.equal(layer(x[start : start + rows]), together[start : start + rows])
    assert (together[5] == (layer.bias if layer.bias is not None else 0)).all()


@needs_a_path
@pytest.mark.parametrize("many", MANY, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_the_kernels_builds_agree_bit_for_bit_with_torch_operations(many: tuple, bias: bool):
    """Few rows (the kernel against torch's steps) and many (the C file's quantization and
    rescaling around the library's product against torch's steps)."""
    linear = Linear(96, 40, bias=bias)
    for rows in (6, 3 * int8_rows.KERNEL_ROWS + 5):
        x = torch.randn(rows, 96) * torch.logspace(-3, 3, rows)[:, None]
        with torch.no_grad():
            outputs = [Int8Linear(linear, Int8Path(k, *many))(x) for k in KERNELS]
        assert all(torch.equal(out, outputs[-1]) for out in outputs)


def test_the_kernel_refuses_more_rows_than_it_holds():
    if not int8_rows.runnable():
        pytest.skip("this CPU has no AVX2: the int8 kernel is not built")
    q, scale = quantize_per_channel(torch.randn(8, 32))
    offset = 128 * q.sum(dim=1, dtype=torch.int32)
    rows = torch.randn(int8_rows.KERNEL_ROWS + 1, 32)
    with pytest.raises(ValueError, match="at most"):
        int8_rows.linear(rows, q, offset, scale, None, 127, int8_rows.runnable()[0])


def test_the_path_follows_the_cpu():
    path = int8_path()
    assert path.many == ("int_mm" if VNNI else "fbgemm")
    assert path.levels == (127 if VNNI else 63)
    assert path.kernel == int8_rows.best()


def test_weights_take_a_quarter_of_float32_beside_scales_offsets_and_bias():
    linear = Linear(64, 48)
    single = Int8Linear(linear, Int8Path(None, "int_mm", 127))
    assert single.weight_bytes() == 64 * 48 + 8 * 48 + 4 * 48
    if FBGEMM:  # FBGEMM keeps its own packed copy of W
        assert (
            Int8Linear(linear, Int8Path(None, "fbgemm", 63)).weight_bytes() == 2 * 64 * 48 + 12 * 48
        )


@pytest.mark.parametrize("scaled", [True, False])
def test_an_int8_embedding_is_within_half_a_step_of_its_table_per_row(scaled: bool):
    token = TokenEmbedding(50, 24, scale=scaled)
    ids = torch.tensor([[0, 7, 49], [3, 3, 12]])
    table = Int8Embedding(token)
    with torch.no_grad():
        exact, int8 = token(ids), table(ids)
    _, step = quantize_per_channel(token.weight)
    assert ((int8 - exact).abs() <= step[ids, None] / 2 * token.scale * (1 + 1e-6)).all()
    with pytest.raises(AttnkitError, match="outside the vocabulary"):
        table(torch.tensor([50]))


@needs_a_path
def test_an_embedding_tied_to_the_head_reads_the_heads_int8_matrix():
    token = TokenEmbedding(40, 32)
    head = Linear(32, 40, bias=False)
    head.weight = token.weight
    int8_head = Int8Linear(head, Int8Path(None, *MANY[0]))
    table = Int8Embedding(token, int8_head)
    assert table.weight is int8_head.weight and table.scale is int8_head.scale
    ids = torch.arange(40)
    with torch.no_grad():
        assert torch.equal(table(ids), Int8Embedding(token)(ids))
