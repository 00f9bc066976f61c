"""The feed-forward network against eq. 2, and its gated variants against Shazeer (2020)."""

import pytest
import torch
import torch.nn.functional as F

from attnkit.nn import FeedForward


def test_plain_ffn_is_equation_2() -> None:
    torch.manual_seed(0)
    ffn, x = FeedForward(8, 32, "relu"), torch.randn(2, 3, 8)
    w1, b1, w2, b2 = ffn.w_1.weight, ffn.w_1.bias, ffn.w_2.weight, ffn.w_2.bias
    torch.testing.assert_close(ffn(x), torch.clamp(x @ w1.T + b1, min=0) @ w2.T + b2)


@pytest.mark.parametrize(("name", "act"), [("swiglu", F.silu), ("geglu", F.gelu)])
def test_gated_ffn_is_act_of_the_gate_times_the_linear_unit(name, act) -> None:
    torch.manual_seed(0)
    ffn, x = FeedForward(8, 32, name, bias=False), torch.randn(2, 3, 8)
    w, v = ffn.w_1.weight[:32], ffn.w_1.weight[32:]  # gate rows first
    assert ffn.w_1.weight.shape == (64, 8)
    torch.testing.assert_close(ffn(x), (act(x @ w.T) * (x @ v.T)) @ ffn.w_2.weight.T)


def test_swiglu_equals_llamas_mlp() -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    torch.manual_seed(0)
    theirs = LlamaMLP(LlamaConfig(hidden_size=8, intermediate_size=32, num_attention_heads=2))
    ours = FeedForward(8, 32, "swiglu", bias=False)
    with torch.no_grad():
        ours.w_1.weight.copy_(torch.cat([theirs.gate_proj.weight, theirs.up_proj.weight]))
        ours.w_2.weight.copy_(theirs.down_proj.weight)
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(ours(x), theirs(x))


@pytest.mark.parametrize("activation", ["relu", "swiglu"])
def test_activation_dropout_acts_on_the_hidden_units_in_training_only(activation: str) -> None:
    torch.manual_seed(0)
    ff = FeedForward(8, 16, activation, dropout=0.5)
    plain = FeedForward(8, 16, activation)
    plain.load_state_dict(ff.state_dict())
    x = torch.randn(3, 8)
    ff.eval()
    assert torch.equal(ff(x), plain(x))  # no dropout at inference
    ff.train()
    torch.manual_seed(1)
    got = ff(x)
    h = ff.w_1(x)
    if activation == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        hidden = torch.nn.functional.silu(gate) * up
    else:
        hidden = torch.relu(h)
    torch.manual_seed(1)
    expected = ff.w_2(torch.nn.functional.dropout(hidden, 0.5, training=True))
    assert torch.allclose(got, expected) and not torch.allclose(got, plain(x))
