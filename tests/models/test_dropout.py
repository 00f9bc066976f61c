"""Where each dropout acts, shown by its effect, and compared with where nanoGPT's acts.

A dropout of rate 1 zeros all it touches, so a model in training with one rate at 1 (the
others 0; a config takes rates below 1, so the model is built with 0.5 and every dropout
of that rate is then raised to 1) must equal the same model in evaluation with exactly the
tensor that rate is said to act on replaced by zeros (`ModelConfig`'s docstring):

    embedding_dropout   the sum of token embeddings and positions, before the first block
    attention_dropout   the attention weights (so each attention reads zeros: W_o 0 + b_o)
    dropout             each residual branch, the sub-layer's output before the sum
    activation_dropout  the feed-forward's hidden activations (so it gives W_2 0 + b_2)

Zeroing anything else, or anything less, gives other outputs. Then nanoGPT: its one
`dropout` acts on the embeddings' sum, the attention weights and both residual branches
(bench/peers/nanogpt.py places it there); with its weights copied into attnkit and the same
random stream, attnkit in training gives the same logits exactly when embedding_dropout,
attention_dropout and dropout are all nanoGPT's rate and activation_dropout is 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
from torch import Tensor, nn

from attnkit.models import build_model
from attnkit.models.stack import Embed
from attnkit.nn import MultiHeadAttention
from attnkit.nn.feedforward import FeedForward
from bench.peers.nanogpt import NanoGPT
from tests.helpers import tiny_config

RATES = ("embedding_dropout", "attention_dropout", "dropout", "activation_dropout")


def _zeros_output(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
    return torch.zeros_like(output)


def _zeros_input(module: nn.Module, args: tuple) -> tuple:
    return (torch.zeros_like(args[0]),)


def _zeroed(model: nn.Module, rate: str) -> list[torch.utils.hooks.RemovableHandle]:
    """Hooks that replace by zeros the tensors that `rate` is said to act on."""
    hooks = []
    for module in model.modules():
        if rate == "embedding_dropout" and isinstance(module, Embed):
            hooks.append(module.register_forward_hook(_zeros_output))
        if isinstance(module, MultiHeadAttention):
            if rate == "attention_dropout":  # weights 0: the heads' output is 0
                hooks.append(module.out_proj.register_forward_pre_hook(_zeros_input))
            if rate == "dropout":
                hooks.append(module.out_proj.register_forward_hook(_zeros_output))
        if isinstance(module, FeedForward):
            if rate == "activation_dropout":
                hooks.append(module.w_2.register_forward_pre_hook(_zeros_input))
            if rate == "dropout":
                hooks.append(module.w_2.register_forward_hook(_zeros_output))
    return hooks


def _all_or_nothing(model: nn.Module, rate: float) -> None:
    """Every dropout of `rate` (the only non-zero one) raised to 1."""
    for module in model.modules():
        if isinstance(module, nn.Dropout) and module.p == rate:
            module.p = 1.0
        if isinstance(module, MultiHeadAttention) and module.dropout == rate:
            module.dropout = 1.0


def _run(model: nn.Module, shape: str) -> Tensor:
    ids = torch.tensor([[5, 6, 7, 8, 9], [9, 3, 4, 2, 1]])
    if shape == "encoder-decoder":
        return model(ids, ids[:, :4]).logits
    return model(ids).logits if shape == "decoder" else model(ids).hidden


@pytest.mark.parametrize("shape", ["decoder", "encoder-decoder", "encoder"])
@pytest.mark.parametrize("rate", RATES)
def test_each_dropout_zeros_exactly_the_tensor_it_is_said_to_act_on(shape, rate) -> None:
    rates = dict.fromkeys(RATES, 0.0)
    torch.manual_seed(0)
    model = build_model(tiny_config(shape, **{**rates, rate: 0.5}))
    _all_or_nothing(model, 0.5)
    dropped = _run(model.train(), shape)
    hooks = _zeroed(model.eval(), rate)
    ablated = _run(model, shape)
    torch.testing.assert_close(dropped, ablated, atol=1e-6, rtol=0)
    for hook in hooks:
        hook.remove()
    # and the rate changed something: without the zeros the outputs differ
    assert (_run(model, shape) - dropped).abs().max() > 1e-3


@pytest.mark.parametrize("rate", RATES)
def test_each_dropout_acts_in_training_only(rate) -> None:
    torch.manual_seed(0)
    model = build_model(tiny_config("decoder", **{**dict.fromkeys(RATES, 0.0), rate: 0.5}))
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    plain = build_model(tiny_config("decoder", **dict.fromkeys(RATES, 0.0)))
    plain.load_state_dict(model.state_dict())
    torch.testing.assert_close(model.eval()(ids).logits, plain.eval()(ids).logits)
    assert not torch.allclose(model.train()(ids).logits, plain.eval()(ids).logits)


def _nanogpt_twin(p: float, **rates: float) -> tuple[NanoGPT, nn.Module]:
    """nanoGPT with dropout `p` and attnkit's decoder of the same weights, with `rates`."""
    torch.manual_seed(0)
    peer = NanoGPT(vocab=24, block=16, layers=2, heads=2, d=16, dropout=p)
    config = tiny_config(
        "decoder", layers=2, d_ff=64, max_len=16, positional="learned", norm_position="pre",
        activation="gelu", scale_embeddings=False, **rates,
    )  # fmt: skip
    model = build_model(config)
    state = {"embed.token.weight": peer.wte.weight, "embed.positions.table": peer.wpe.weight}
    for i, block in enumerate(peer.blocks):
        ours = f"decoder.blocks.{i}."
        pairs = {
            "self_attn.qkv_proj": block.attn.c_attn, "self_attn.out_proj": block.attn.c_proj,
            "self_attn_residual.norm": block.ln_1, "ff_residual.norm": block.ln_2,
            "ff.w_1": block.mlp[0], "ff.w_2": block.mlp[2],
        }  # fmt: skip
        for name, theirs in pairs.items():
            state |= {f"{ours}{name}.weight": theirs.weight, f"{ours}{name}.bias": theirs.bias}
    state |= {"decoder.norm.weight": peer.ln_f.weight, "decoder.norm.bias": peer.ln_f.bias}
    state["head.weight"] = peer.lm_head.weight
    model.load_state_dict(state)
    return peer, model


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        yield


def _same_stream(
    first: Callable[[], Tensor], second: Callable[[], Tensor]
) -> tuple[Tensor, Tensor]:
    with _seeded(7):
        a = first()
    with _seeded(7):
        b = second()
    return a, b


def test_nanogpts_dropout_is_attnkits_embedding_attention_and_residual_dropout() -> None:
    p = 0.2
    nanogpt = dict(embedding_dropout=p, attention_dropout=p, dropout=p, activation_dropout=0.0)
    peer, model = _nanogpt_twin(p, **nanogpt)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [12, 3, 4, 2, 1, 0, 7, 7]])
    # without dropout the two are one function
    torch.testing.assert_close(model.eval()(ids).logits, peer.eval().logits(ids))
    ours, theirs = _same_stream(lambda: model.train()(ids).logits, lambda: peer.train().logits(ids))
    assert not torch.allclose(theirs, peer.eval().logits(ids))  # the dropout did act
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "rates",
    [
        # residual dropout alone, as a run config that sets only model.dropout
        dict(embedding_dropout=0.0, attention_dropout=0.0, dropout=0.2, activation_dropout=0.0),
        # the attention weights left out
        dict(embedding_dropout=0.2, attention_dropout=0.0, dropout=0.2, activation_dropout=0.0),
        # dropout on the hidden activations, which nanoGPT has not
        dict(embedding_dropout=0.2, attention_dropout=0.2, dropout=0.2, activation_dropout=0.2),
    ],
)
def test_any_other_placement_is_not_nanogpts(rates) -> None:
    peer, model = _nanogpt_twin(0.2, **rates)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    ours, theirs = _same_stream(lambda: model.train()(ids).logits, lambda: peer.train().logits(ids))
    assert (ours - theirs).abs().max() > 1e-3
