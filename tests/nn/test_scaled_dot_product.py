"""The one choice of how an attention call runs (`Kernel.choose`), and every way computing the
same attention."""

import pytest
import torch

from attnkit.kernels import step_attention
from attnkit.nn.scaled_dot_product import MANY_ROWS, Kernel, computed


def qkv(rows: int, queries: int) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return torch.randn(rows, 2, queries, 8), torch.randn(rows, 2, 9, 8), torch.randn(rows, 2, 9, 8)


@torch.no_grad()
def test_each_call_is_given_the_kernel_its_shape_and_wishes_ask_for() -> None:
    q, k, _ = qkv(2, 3)
    assert Kernel.choose(q, k, blockwise=True, weights=True) is Kernel.BLOCKWISE
    assert Kernel.choose(q, k, weights=True, step=True) is Kernel.WEIGHTS
    step = Kernel.STEP if step_attention.available() else Kernel.FUSED
    assert Kernel.choose(q, k, step=True) is step
    assert Kernel.choose(q, k, step=True, dropout_p=0.1) is Kernel.FUSED
    per_head = torch.ones(2, 2, 3, 9, dtype=torch.bool)  # the C kernel takes one mask for all heads
    assert Kernel.choose(q, k, per_head, step=True) is Kernel.FUSED
    many, k_many, _ = qkv(MANY_ROWS // 2, 1)  # x 2 heads: a large batch's decoding step
    assert Kernel.choose(many, k_many) is Kernel.PRODUCTS
    assert Kernel.choose(many, k_many, backend="math") is Kernel.FUSED  # a backend asked for
    with torch.enable_grad():
        assert Kernel.choose(many, k_many) is Kernel.FUSED  # training keeps the fused kernel


@pytest.mark.parametrize("causal", [False, True])
def test_the_fused_kernel_and_the_products_compute_the_same(causal: bool) -> None:
    q, k, v = qkv(3, 9)
    mask = None if causal else torch.rand(3, 1, 9, 9) > 0.3
    fused, none = computed(Kernel.FUSED, q, k, v, mask, is_causal=causal)
    products, _ = computed(Kernel.PRODUCTS, q, k, v, mask, is_causal=causal)
    weighted, weights = computed(Kernel.WEIGHTS, q, k, v, mask, is_causal=causal)
    assert none is None and weights is not None
    torch.testing.assert_close(products, fused, atol=1e-5, rtol=0)
    torch.testing.assert_close(weighted, fused, atol=1e-5, rtol=0)
