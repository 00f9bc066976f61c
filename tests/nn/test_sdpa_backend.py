"""attention_backend: one fused kernel asked for, the kernels that ran, the causal flag kept."""

from __future__ import annotations

import pytest
import torch

from attnkit.config import ATTENTION_BACKENDS
from attnkit.errors import AttnkitError
from attnkit.nn import sdpa_backend
from attnkit.nn.scaled_dot_product import scaled_dot_product_attention
from tests.helpers import DECODING, padded_batch, tiny_model


def test_every_attention_backend_a_config_may_name_has_its_kernel() -> None:
    assert tuple(sdpa_backend.BACKENDS) == ATTENTION_BACKENDS


def qkv() -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(2, 4, 9, 8) for _ in range(3))


@pytest.mark.parametrize(("backend", "kernel"), [("math", "math"), ("flash", "flash (CPU)")])
def test_a_backend_runs_its_kernel_and_computes_the_same(backend: str, kernel: str) -> None:
    q, k, v = qkv()
    mask = torch.rand(2, 1, 9, 9) > 0.3
    mask |= torch.eye(9, dtype=torch.bool)  # no empty row
    expected, _ = scaled_dot_product_attention(q, k, v, mask, need_weights=True)
    out = []
    ran = sdpa_backend.kernels_run(
        lambda: out.append(scaled_dot_product_attention(q, k, v, mask, backend=backend)[0])
    )
    assert set(ran) == {kernel}
    torch.testing.assert_close(out[0], expected, atol=1e-5, rtol=1e-5)


def test_auto_lets_torch_choose_its_cpu_flash_kernel() -> None:
    q, k, v = qkv()
    ran = sdpa_backend.kernels_run(lambda: scaled_dot_product_attention(q, k, v, is_causal=True))
    assert set(ran) == {"flash (CPU)"}


def test_a_kernel_that_cannot_run_the_inputs_is_refused_in_one_sentence() -> None:
    q, k, v = qkv()
    if torch.cuda.is_available():
        pytest.skip("a CUDA build may run memory-efficient attention; the refusal is a CPU's")
    with pytest.raises(AttnkitError, match="attention_backend 'efficient' cannot run"):
        scaled_dot_product_attention(q, k, v, backend="efficient")


def test_a_model_on_the_math_backend_runs_only_math_and_equals_auto() -> None:
    ids, mask = padded_batch([6, 3], 6)
    auto = tiny_model("decoder", **DECODING).eval()
    math_model = tiny_model("decoder", **DECODING, attention_backend="math").eval()
    with torch.no_grad():
        expected = auto(ids, mask).logits
        got = []
        ran = sdpa_backend.kernels_run(lambda: got.append(math_model(ids, mask).logits))
    assert set(ran) == {"math"} and ran["math"] == 2  # one per layer
    real = mask[..., None]
    torch.testing.assert_close(got[0] * real, expected * real, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("side", "flag"), [("right", True), ("left", False)])
def test_right_padding_keeps_the_causal_flag_instead_of_a_mask(monkeypatch, side, flag) -> None:
    calls = []
    fused = sdpa_backend.fused_attention

    def spy(q, k, v, backend="auto", **options):
        calls.append((options["attn_mask"] is None, options["is_causal"]))
        return fused(q, k, v, backend, **options)

    monkeypatch.setattr("attnkit.nn.scaled_dot_product.fused_attention", spy)
    ids, mask = padded_batch([6, 3], 6)
    if side == "left":
        ids, mask = ids.flip(1), mask.flip(1)
    model = tiny_model("decoder", **DECODING).eval()
    with torch.no_grad():
        model(ids, mask)
    assert calls and all(call == (flag, flag) for call in calls)
