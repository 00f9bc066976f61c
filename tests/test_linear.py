"""The linear layer's inference path (oneDNN, packed weight) against `F.linear`."""

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from attnkit.nn import Linear
from attnkit.nn import linear as linear_module

needs_onednn = pytest.mark.skipif(
    not linear_module._ONEDNN, reason="this torch build has no oneDNN inner product"
)


@pytest.mark.parametrize("out_features", [80, 81])  # 81 cannot be cut into two blocks
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 48), (3, 1, 48), (8, 48), (2, 5, 48), (200, 48)])
def test_inference_equals_f_linear(shape: tuple[int, ...], bias: bool, out_features: int) -> None:
    layer = Linear(48, out_features, bias=bias)
    x = torch.randn(shape)
    with torch.no_grad():
        out = layer(x)
    expected = F.linear(x, layer.weight, layer.bias)
    assert out.shape == (*shape[:-1], out_features)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_few_rows_take_a_packed_path_and_many_rows_do_not() -> None:
    layer = Linear(16, 32)
    with torch.no_grad():
        layer(torch.randn(linear_module.FEW_ROWS + 1, 16))
        assert layer._packed is None
        layer(torch.randn(linear_module.SPLIT_ROWS, 16))
        assert list(layer._packed) == ["two-block"]
        layer(torch.randn(linear_module.SPLIT_ROWS + 1, 16))
        assert list(layer._packed) == ["two-block", "onednn"]
    layer._packed = None
    layer(torch.randn(4, 16))  # with autograd: F.linear, which has a backward
    assert layer._packed is None


@needs_onednn
@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda params: torch.optim.SGD(params, lr=0.5),
        # The fused kernel writes the weight without bumping its version counter.
        lambda params: torch.optim.AdamW(params, lr=0.5, fused=True),
    ],
    ids=["sgd", "fused-adamw"],
)
@pytest.mark.parametrize("rows", [2, linear_module.SPLIT_ROWS + 1])  # two blocks, oneDNN
def test_packed_weight_follows_weight_updates(make_optimizer: Callable, rows: int) -> None:
    """An optimizer step between two decodes must be seen by the second one."""
    layer = Linear(16, 32)
    x = torch.randn(rows, 16)
    with torch.no_grad():
        before = layer(x)
    optimizer = make_optimizer(layer.parameters())
    layer(torch.randn(8, 16)).square().sum().backward()
    optimizer.step()
    with torch.no_grad():
        after = layer(x)
        expected_after = F.linear(x, layer.weight, layer.bias)
        layer.weight.copy_(torch.randn(32, 16))  # as a checkpoint load does
        loaded = layer(x)
        expected_loaded = F.linear(x, layer.weight, layer.bias)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, expected_after, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loaded, expected_loaded, rtol=1e-5, atol=1e-5)


def test_gradients_flow_as_in_nn_linear() -> None:
    layer = Linear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None
    torch.testing.assert_close(layer.weight.grad, torch.ones(4, 3) @ x.detach())


@needs_onednn
def test_a_layer_with_a_packed_weight_copies_and_pickles(tmp_path) -> None:
    layer = Linear(16, 32)
    x = torch.randn(2, 16)
    with torch.no_grad():
        expected = layer(x)
    assert layer._packed is not None
    twin = copy.deepcopy(layer)
    torch.save(layer, tmp_path / "layer.pt")
    loaded = torch.load(tmp_path / "layer.pt", weights_only=False)
    for other in (twin, loaded):
        assert other._packed is None  # the cache is left behind and rebuilt on use
        with torch.no_grad():
            torch.testing.assert_close(other(x), expected, rtol=0, atol=0)
