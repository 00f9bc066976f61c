"""The linear layer's inference path over the weight's halves against `F.linear`."""

import pytest
import torch
import torch.nn.functional as F

from attnkit.nn import Linear
from attnkit.nn import linear as linear_module


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
    layer = Linear(16, 32)
    calls = []
    halves = layer._halves_product
    monkeypatch.setattr(layer, "_halves_product", lambda x: calls.append(x) or halves(x))
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
