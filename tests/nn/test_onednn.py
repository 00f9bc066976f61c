"""The oneDNN float32 path: exact against float64, chosen by a probe kept per shape class."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnkit.nn import Linear, onednn

pytestmark = pytest.mark.skipif(
    not onednn.enabled(),
    reason="this CPU has no AVX-512 (or torch no oneDNN): Linear keeps MKL and its own paths",
)


@pytest.fixture
def fresh(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No decision known, in memory or on disk (an empty cache directory)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(onednn, "_speedups", None)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 40), (7, 40), (3, 5, 40)])
def test_forward_and_gradients_equal_float64(shape: tuple[int, ...], bias: bool) -> None:
    weight = torch.randn(24, 40, requires_grad=True)
    b = torch.randn(24, requires_grad=True) if bias else None
    x = torch.randn(shape, requires_grad=True)
    y = onednn.linear(x, weight, b)
    upstream = torch.randn_like(y)
    y.backward(upstream)
    leaves = [x, weight] + ([b] if bias else [])
    grads = [t.grad.clone() for t in leaves]
    doubles = [t.detach().double().requires_grad_() for t in leaves]
    expected = F.linear(doubles[0], doubles[1], doubles[2] if bias else None)
    expected.backward(upstream.double())
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, doubles, strict=True):
        torch.testing.assert_close(got.double(), want.grad, rtol=1e-5, atol=1e-5)


def test_linear_goes_where_the_probe_says(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = Linear(40, 24)
    x = torch.randn(64, 40)
    taken = []
    product = onednn.linear
    monkeypatch.setattr(onednn, "linear", lambda *a: taken.append(1) or product(*a))
    for verdict in (True, False):
        monkeypatch.setattr(onednn, "faster", lambda *a, verdict=verdict: verdict)
        y = layer(x)  # training: a graph through whichever path
        y.sum().backward()
        torch.testing.assert_close(y, F.linear(x, layer.weight, layer.bias))
    assert taken == [1]


def test_each_shape_class_is_probed_once(fresh, monkeypatch: pytest.MonkeyPatch) -> None:
    probes = []
    probe = onednn._probe
    monkeypatch.setattr(onednn, "_probe", lambda *a: probes.append(a[0]) or probe(*a))
    layer = Linear(256, 128)  # from 32 rows a product of over 2^20 multiply-adds
    with torch.no_grad():
        for rows in (8, 33, 40, 64, 65):  # too small, three of 64 rows, one of 128
            layer(torch.randn(rows, 256))
    assert probes == [64, 128]
    assert {key[0] for key in onednn.decisions()} == {64, 128}


@pytest.mark.parametrize(("speedup", "small_training_takes_it"), [(1.1, False), (1.3, True)])
def test_a_small_training_product_needs_a_clear_speedup(
    fresh, monkeypatch, speedup: float, small_training_takes_it: bool
) -> None:
    """In training a product pays for the autograd Function too: a small one needs more."""
    monkeypatch.setattr(onednn, "_probe", lambda *a: speedup)
    taken = []
    product = onednn.linear
    monkeypatch.setattr(onednn, "linear", lambda *a: taken.append(a[0].shape[0]) or product(*a))
    layer = Linear(256, 128)  # 2^15 multiply-adds a row
    small, large = 1 << 10, onednn.SMALL_TRAINING_PRODUCT >> 15
    layer(torch.randn(small, 256)).sum().backward()
    layer(torch.randn(large, 256)).sum().backward()
    with torch.no_grad():
        layer(torch.randn(small, 256))
    assert taken == [small] * small_training_takes_it + [large, small]


def test_autocast_keeps_f_linear_so_products_run_in_bfloat16() -> None:
    layer = Linear(40, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(torch.randn(64, 40)).dtype == torch.bfloat16


def test_a_probe_leaves_torch_random_state_alone(fresh) -> None:
    layer, x = Linear(256, 128), torch.randn(64, 256)  # past the few-row kernel, not small
    before = torch.get_rng_state()
    with torch.no_grad():
        layer(x)  # the first product of its shape class: a probe runs
    assert len(onednn.decisions()) == 1
    assert torch.equal(torch.get_rng_state(), before)


def test_decisions_are_kept_on_disk_for_the_next_process(fresh, monkeypatch) -> None:
    layer = Linear(256, 128)
    with torch.no_grad():
        layer(torch.randn(64, 256))  # probes, and writes the decision
    made = onednn.decisions()
    assert onednn.decisions_file().is_file() and len(made) == 1
    # A new process: nothing in memory, and no probe may run.
    monkeypatch.setattr(onednn, "_speedups", None)
    monkeypatch.setattr(onednn, "_probe", lambda *a: pytest.fail("probed again"))
    with torch.no_grad():
        layer(torch.randn(50, 256))  # the same class of 64 rows
    assert onednn.decisions() == made
