"""Compute types: int8 and bfloat16 linear layers against float32, and converted models."""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import AttnkitError
from attnkit.generation import generate
from attnkit.kernels.cpu import Cpu
from attnkit.nn import compute_type as ct
from attnkit.nn.int8_linear import int8_path
from attnkit.nn.linear import Linear
from tests.helpers import peaked, source_batch, tiny_model

CPU = torch.device("cpu")


def needs(compute_type: str):
    """Skip where this machine cannot run `compute_type`, saying why (the refusal's sentence)."""
    reason = ct.refusal(compute_type, CPU)
    return pytest.mark.skipif(reason is not None, reason=f"this CPU: {reason}")


@needs("bf16")
def test_bf16_linear_is_within_bfloat16_rounding_of_float32():
    linear = Linear(64, 48)
    rows = torch.randn(256, 64)
    with torch.no_grad():
        y, y16 = linear(rows), ct.BFloat16Linear(linear)(rows)
    # Inputs and weights each rounded to 8 bits of mantissa (2^-9 relative), summed in float32.
    assert ((y16 - y).norm(dim=0) / y.norm(dim=0)).max() < 2**-6


def test_float32_converts_nothing_and_unknown_types_are_refused():
    model = peaked("decoder")
    assert ct.convert(model, "float32") == "float32"
    assert ct.compute_type_of(model) == "float32"
    with pytest.raises(
        AttnkitError, match="not one of float32, int8, bf16, int8-weights, fp8, auto"
    ):
        ct.convert(model, "int4")


def test_bf16_is_refused_in_one_sentence_on_a_cpu_without_bf16_products(monkeypatch):
    monkeypatch.setattr(ct, "this_cpu", lambda: Cpu("an AVX2 CPU", frozenset({"avx2"})))
    reason = ct.refusal("bf16", CPU)
    assert reason is not None and "AVX512-BF16 or AMX" in reason and reason.count(".") == 0
    with pytest.raises(AttnkitError, match="AVX512-BF16 or AMX"):
        ct.resolve("bf16", CPU)


def test_auto_falls_back_to_float32_where_nothing_faster_runs(monkeypatch):
    monkeypatch.setattr(ct, "this_cpu", lambda: Cpu("an old CPU", frozenset()))
    assert ct.resolve("auto", CPU) == "float32"
    with pytest.raises(AttnkitError, match="AVX2"):
        ct.resolve("int8", CPU)


def test_int8_is_refused_off_the_cpu():
    assert "CPU" in ct.refusal("int8", torch.device("cuda"))


@pytest.mark.skipif(
    ct.refusal("int8", CPU) is not None and ct.refusal("bf16", CPU) is not None,
    reason="this CPU runs neither int8 nor bf16, so nothing would be converted",
)
def test_a_model_in_training_mode_is_not_converted():
    model = peaked("decoder").train()
    with pytest.raises(AttnkitError, match=r"model\.eval"):
        ct.convert(model, "bf16" if ct.refusal("bf16", CPU) is None else "int8")


CONVERTIBLE = [t for t in ("int8", "bf16") if ct.refusal(t, CPU) is None]


@pytest.mark.skipif(not CONVERTIBLE, reason="this CPU runs neither int8 nor bf16")
@pytest.mark.parametrize("compute_type", CONVERTIBLE)
@pytest.mark.parametrize("shape", ["decoder", "encoder-decoder"])
def test_converted_models_decode_mostly_the_same_tokens(compute_type: str, shape: str):
    ids, mask = source_batch()
    model = peaked(shape, vocab_size=200, scale=2.0)
    options = {"max_new_tokens": 12, "eos_token_id": ()}
    exact = generate(model, ids, mask, **options).sequences
    float32_bytes = ct.linear_weight_bytes(model)
    assert ct.convert(model, compute_type) == compute_type == ct.compute_type_of(model)
    # A quarter (int8, plus a scale and an offset per output and float32 biases, which
    # weigh more at this tiny width), a half where FBGEMM keeps its packed copy too (CPUs
    # without AVX512-VNNI), or a half (bf16).
    fbgemm = compute_type == "int8" and int8_path().many == "fbgemm"
    share = {"int8": 0.66 if fbgemm else 0.4, "bf16": 0.51}[compute_type]
    assert ct.linear_weight_bytes(model) < float32_bytes * share
    cached = generate(model, ids, mask, **options).sequences
    uncached = generate(model, ids, mask, use_cache=False, **options).sequences
    assert torch.equal(cached, uncached)
    # Once one token differs the rest follow another prefix, so count positions until then.
    new = slice(exact.shape[1] - 12, None)
    agree = (cached[:, new] == exact[:, new]).int().cumprod(1).float().mean()
    assert agree >= 0.75, f"{compute_type}: {agree:.0%} of positions as float32"


@pytest.mark.skipif(not CONVERTIBLE, reason="this CPU runs neither int8 nor bf16")
def test_a_converted_model_is_not_saved(tmp_path):
    from attnkit.run import save_pretrained

    model = peaked("decoder")
    ct.convert(model, CONVERTIBLE[0])
    with pytest.raises(AttnkitError, match="is for decoding"):
        save_pretrained(model, tmp_path)
    assert not (tmp_path / "model.safetensors").exists()


@needs("int8")
@pytest.mark.parametrize("tie", ["all", "none"])
def test_int8_holds_the_token_tables_in_int8_a_tied_one_as_the_heads_matrix(tie: str):
    from attnkit.nn.int8_linear import Int8Embedding

    model = tiny_model("encoder-decoder", layers=1, vocab_size=200, tie_embeddings=tie).eval()
    ct.convert(model, "int8")
    tables = [m for m in model.modules() if isinstance(m, Int8Embedding)]
    assert len(tables) == 2 and not any(
        isinstance(m, torch.nn.Embedding) or type(m).__name__ == "TokenEmbedding"
        for m in model.modules()
    )
    shared = [t for t in tables if t.weight.data_ptr() == model.head.weight.data_ptr()]
    assert len(shared) == (2 if tie == "all" else 0)
