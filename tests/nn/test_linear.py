"""The linear layer's inference paths (the few-row kernel, the weight's halves) against F.linear."""

import logging
import multiprocessing
import os
import shutil

import pytest
import torch
import torch.nn.functional as F

from attnkit.kernels import few_rows, loader, onednn
from attnkit.nn import Linear
from attnkit.nn import linear as linear_module

needs_kernel = pytest.mark.skipif(
    not few_rows.available(), reason="the few-row kernel is built only on x86-64 with AVX2"
)


@pytest.mark.parametrize("out_features", [80, 81])  # 81 cannot be cut into two halves
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 48), (3, 1, 48), (2, 4, 48), (9, 48), (200, 48)])
def test_inference_equals_f_linear(shape: tuple[int, ...], bias: bool, out_features: int) -> None:
    layer = Linear(48, out_features, bias=bias)
    x = torch.randn(shape)
    with torch.no_grad():
        out = layer(x)
    expected = F.linear(x, layer.weight, layer.bias)
    assert out.shape == (*shape[:-1], out_features) and out.is_contiguous()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_few_rows_without_autograd_take_the_halves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onednn, "enabled", lambda: False)  # no probe choosing oneDNN instead
    layer = Linear(16, 32)
    calls = []
    halves = Linear._halves_product
    monkeypatch.setattr(layer, "_halves_product", lambda *a: calls.append(a) or halves(*a))
    with torch.no_grad():
        layer(torch.randn(linear_module.FEW_ROWS, 16))
        assert len(calls) == 1
        layer(torch.randn(linear_module.FEW_ROWS + 1, 16))
        assert len(calls) == 1
    layer(torch.randn(4, 16))  # with autograd: F.linear, which has a backward
    assert len(calls) == 1


def test_a_weight_that_is_not_contiguous_still_works() -> None:
    layer = Linear(16, 32)
    layer.weight = torch.nn.Parameter(torch.randn(16, 32).t())  # a transposed view
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))


def test_gradients_flow_as_in_nn_linear() -> None:
    layer = Linear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None
    torch.testing.assert_close(layer.weight.grad, torch.ones(4, 3) @ x.detach())


def test_the_kernel_is_built_where_it_can_be() -> None:
    if not (loader.avx2_cpu() and shutil.which(os.environ.get("CC", "cc"))):
        pytest.skip("no x86-64 CPU with AVX2, or no C compiler")
    assert few_rows.available()


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 20])
@pytest.mark.parametrize("in_features", [8, 13, 512])  # 13: every row ends in a tail
def test_the_kernel_equals_f_linear(in_features: int, rows: int, bias: bool, threads: int) -> None:
    weight = torch.randn(37, in_features) / in_features**0.5  # outputs of about 1, as in a model
    b = torch.randn(37) if bias else None
    x = torch.randn(rows, in_features)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = few_rows.linear(x, weight, b)
    finally:
        torch.set_num_threads(before)
    exact = F.linear(x.double(), weight.double(), None if b is None else b.double())
    torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=1e-5)


@needs_kernel
def test_up_to_kernel_rows_take_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = Linear(16, 32)
    calls = []
    kernel = few_rows.linear
    monkeypatch.setattr(few_rows, "linear", lambda *a: calls.append(a) or kernel(*a))
    x = torch.randn(2, linear_module.KERNEL_ROWS // 2, 16)  # rows counted over every dim
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
        assert len(calls) == 1
        layer(torch.randn(linear_module.KERNEL_ROWS + 1, 16))
        assert len(calls) == 1  # the halves took it
        layer.weight = torch.nn.Parameter(torch.randn(16, 32).t())  # not contiguous
        torch.testing.assert_close(layer(x[0]), F.linear(x[0], layer.weight, layer.bias))
        assert len(calls) == 1


@pytest.fixture
def fresh_kernel(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """`few_rows` as a new process finds it, with its cache in tmp_path; restored afterwards."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    few_rows._kernel.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    few_rows._kernel.cache_clear()


def test_a_failed_build_warns_and_falls_back(fresh_kernel, caplog: pytest.LogCaptureFixture):
    fresh_kernel.setenv("CC", "false")  # a compiler that always fails
    fresh_kernel.setattr(loader, "avx2_cpu", lambda: True)
    with caplog.at_level(logging.WARNING, logger="attnkit.kernels.loader"):
        assert not few_rows.available()
    assert "false failed" in caplog.text
    layer, x = Linear(16, 32), torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))


def test_the_kernel_can_be_switched_off(fresh_kernel) -> None:
    fresh_kernel.setenv("ATTNKIT_FEW_ROWS_KERNEL", "0")
    assert not few_rows.available()


def _forward(layer: Linear, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return layer(x)


@needs_kernel
def test_the_kernel_runs_in_a_forked_worker() -> None:
    # A DataLoader's workers are forked from a process whose OpenMP threads already ran the
    # kernel, and torch gives them one thread each.
    layer, x = Linear(64, 64), torch.randn(4, 64)
    expected = _forward(layer, x)  # the parent's OpenMP team starts here
    fork = multiprocessing.get_context("fork")
    with fork.Pool(1, initializer=torch.set_num_threads, initargs=(1,)) as pool:
        assert torch.equal(pool.apply_async(_forward, (layer, x)).get(timeout=120), expected)
