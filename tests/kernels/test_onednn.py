"""The oneDNN float32 path: exact against float64, chosen by a probe kept per shape class."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnkit.kernels import onednn
from attnkit.nn import Linear

pytestmark = pytest.mark.skipif(
    not onednn.enabled(),
    reason="this CPU has no AVX-512 (or torch no oneDNN): Linear keeps MKL and its own paths",
)


@pytest.fixture
def fresh(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No decision known, in memory or on disk (an empty cache directory)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(onednn, "_times", None)


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
    assert {key[0] for key in onednn.probe_times()} == {64, 128}


@pytest.mark.parametrize(
    ("trainable", "wants_grad", "counts_as_training"),
    [
        ({"weight", "bias"}, False, True),  # training
        (set(), True, True),  # frozen layer, gradients wanted for its input (LoRA elsewhere)
        ({"bias"}, False, True),  # only the bias trains (BitFit)
        (set(), False, False),  # grad mode on, nothing to differentiate
    ],
)
@pytest.mark.parametrize("gain_us", [60, 100])
def test_in_training_the_gain_must_also_pay_for_the_autograd_function(
    fresh, monkeypatch, trainable: set, wants_grad: bool, counts_as_training: bool, gain_us: int
) -> None:
    """Forward and dL/dx each gain `gain_us`: enough for inference, for training only at 100."""
    assert 2 * 60e-6 < onednn.TRAINING_COST_S < 2 * 100e-6
    monkeypatch.setattr(onednn, "_probe", lambda *a: (1e-3, 1e-3 + gain_us * 1e-6))
    taken = []
    product = onednn.linear
    monkeypatch.setattr(onednn, "linear", lambda *a: taken.append(1) or product(*a))
    layer = Linear(256, 128)
    for name, parameter in layer.named_parameters():
        parameter.requires_grad_(name in trainable)
    layer(torch.randn(64, 256, requires_grad=wants_grad))
    assert bool(taken) == (gain_us == 100 or not counts_as_training)


def test_autocast_keeps_f_linear_so_products_run_in_bfloat16() -> None:
    layer = Linear(40, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(torch.randn(64, 40)).dtype == torch.bfloat16


def test_a_probe_leaves_torch_random_state_alone(fresh) -> None:
    layer, x = Linear(256, 128), torch.randn(64, 256)  # past the few-row kernel, not small
    before = torch.get_rng_state()
    with torch.no_grad():
        layer(x)  # the first product of its shape class: a probe runs
    assert len(onednn.probe_times()) == 1
    assert torch.equal(torch.get_rng_state(), before)


def test_probe_times_are_kept_on_disk_for_the_next_process(fresh, monkeypatch) -> None:
    layer = Linear(256, 128)
    with torch.no_grad():
        layer(torch.randn(64, 256))  # probes, and writes the decision
    made = onednn.probe_times()
    assert onednn.times_file().is_file() and len(made) == 1
    # A new process: nothing in memory, and no probe may run.
    monkeypatch.setattr(onednn, "_times", None)
    monkeypatch.setattr(onednn, "_probe", lambda *a: pytest.fail("probed again"))
    with torch.no_grad():
        layer(torch.randn(50, 256))  # the same class of 64 rows
    assert onednn.probe_times() == made


def test_times_another_process_probed_meanwhile_are_read_not_probed_again(fresh, monkeypatch):
    layer = Linear(256, 128)
    with torch.no_grad():
        layer(torch.randn(64, 256))  # this process probes its first class and keeps the times
    theirs = (128, 128, 256, True, "halves")  # the class of 65 to 128 rows
    onednn._write_times({**onednn.probe_times(), theirs: (1.0, 2.0)})  # another process's probe
    monkeypatch.setattr(onednn, "_probe", lambda *a: pytest.fail("probed again"))
    with torch.no_grad():
        layer(torch.randn(100, 256))
    assert onednn.probe_times()[theirs] == (1.0, 2.0)
