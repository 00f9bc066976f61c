"""8-bit weights for a GPU's decoding (`nn/weight_only.py`), their numbers checked on the CPU
against a float reference, torch's own int8 weight-only product, and the compute types."""

import pytest
import torch
from torch import nn

from attnkit.errors import AttnkitError
from attnkit.nn import compute_type as ct
from attnkit.nn.int8_linear import dequantize
from attnkit.nn.weight_only import (
    FLOAT8,
    FLOAT8_MAX,
    Float8Linear,
    WeightOnlyInt8Linear,
    quantize_float8,
)
from tests.helpers import peaked


def _linear(bias: bool, dtype=torch.float32, out: int = 48, features: int = 64) -> nn.Linear:
    torch.manual_seed(0)
    linear = nn.Linear(features, out, bias=bias)
    with torch.no_grad():
        linear.weight[3] = 0  # an all-zero row stays zero
        linear.weight[5, 7] = 4.0  # an outlier sets its row's scale
    return linear.to(dtype)


@pytest.mark.parametrize("bias", [False, True])
def test_int8_weights_compute_the_product_of_the_dequantized_weight(bias):
    linear = _linear(bias)
    layer = WeightOnlyInt8Linear(linear)
    assert layer.weight.dtype == torch.int8
    x = torch.randn(2, 5, 64)
    w = dequantize(layer.weight, layer.scale)
    reference = torch.nn.functional.linear(x, w, linear.bias)
    torch.testing.assert_close(layer(x), reference, rtol=1e-5, atol=1e-5)
    # Against the float weight: each weight within half a step of its row's scale.
    exact = linear(x).detach()
    bound = x.abs() @ (layer.scale[:, None].expand(-1, 64) / 2).t()
    assert ((layer(x) - exact).abs() <= bound + 1e-5).all()
    assert torch.equal(layer(x)[..., 3], torch.zeros(2, 5) + (0 if not bias else linear.bias[3]))


def test_int8_weights_in_bfloat16_agree_with_torchs_int8_weight_only_kernel():
    linear = _linear(False, torch.bfloat16)
    layer = WeightOnlyInt8Linear(linear)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    theirs = torch._weight_int8pack_mm(x, layer.weight, layer.scale)
    ours = layer(x)
    assert ours.dtype == torch.bfloat16 and layer.scale.dtype == torch.bfloat16
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=2e-2, atol=2e-2)
    assert layer.weight_bytes() == 48 * 64 + 2 * 48  # a byte a weight, bf16 scales


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 33])
def test_float8_products_equal_the_e4m3_numbers_they_stand_for(bias, rows):
    linear = _linear(bias)
    layer = Float8Linear(linear)
    assert layer.weight.dtype == FLOAT8
    x = torch.randn(rows, 64) * 3
    # The reference: x and W rounded to e4m3 on their scales, multiplied in float64.
    x_scale = x.abs().max() / FLOAT8_MAX
    x8 = (x / x_scale).to(FLOAT8).double() * x_scale
    w8 = layer.weight.double() * layer.scale.double()[:, None]
    reference = x8 @ w8.t() + (0 if linear.bias is None else linear.bias.double())
    torch.testing.assert_close(layer(x).double(), reference, rtol=1e-5, atol=1e-5)
    # e4m3 keeps 3 bits of mantissa: within a few percent of the float layer.
    exact = linear(x).detach()
    assert (layer(x) - exact).norm() / exact.norm() < 0.06


def test_float8_quantization_keeps_each_rows_largest_weight():
    weight = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0]])
    q, scale = quantize_float8(weight)
    torch.testing.assert_close(scale, torch.tensor([2.0 / FLOAT8_MAX, 1.0]))
    assert q.float()[0, 1] == -FLOAT8_MAX and (q.float()[1] == 0).all()


def test_the_gpu_compute_types_are_refused_on_the_cpu_in_one_sentence():
    cpu = torch.device("cpu")
    for name in ("int8-weights", "fp8"):
        reason = ct.refusal(name, cpu)
        assert reason is not None and "CUDA GPU" in reason and "int8" in reason
        with pytest.raises(AttnkitError, match="for a CUDA GPU"):
            ct.resolve(name, cpu)
    assert "int8-weights" in ct.refusal("int8", torch.device("cuda"))


def test_fp8_is_refused_on_a_gpu_without_float8_tensor_cores(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "8.9" in ct.refusal("fp8", torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert ct.refusal("fp8", torch.device("cuda")) is None


@pytest.mark.parametrize("name", ["int8-weights", "fp8"])
def test_convert_swaps_a_models_linears_for_8_bit_weights(monkeypatch, name):
    model = peaked("decoder").eval()
    ids = torch.randint(5, 20, (2, 6))
    expected = model(ids).logits
    # The refusal is the device's; the layers themselves run on the CPU.
    monkeypatch.setattr(ct, "refusal", lambda compute_type, device: None)
    before = ct.linear_weight_bytes(model)
    assert ct.convert(model, name) == name
    assert ct.compute_type_of(model) == name
    kind = {"int8-weights": WeightOnlyInt8Linear, "fp8": Float8Linear}[name]
    layers = [m for m in model.modules() if isinstance(m, kind)]
    assert layers
    assert ct.linear_weight_bytes(model) < before / 2
    got = model(ids).logits
    assert ((got - expected).norm() / expected.norm()) < 0.06


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
@pytest.mark.parametrize("name", ["int8-weights", "fp8"])
def test_on_a_gpu_the_8_bit_layers_give_the_cpus_numbers(name):
    if name == "fp8" and ct.refusal("fp8", torch.device("cuda")) is not None:
        pytest.skip("this GPU has no float8 tensor cores")  # what the refusal says, tested above
    linear = _linear(True, torch.bfloat16, out=64)
    kind = {"int8-weights": WeightOnlyInt8Linear, "fp8": Float8Linear}[name]
    layer = kind(linear)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    on_cpu = layer(x).float()
    on_gpu = layer.cuda()(x.cuda()).float().cpu()
    torch.testing.assert_close(on_gpu, on_cpu, rtol=2e-2, atol=2e-2)
