"""Activation checkpointing: the same gradients as the plain forward pass, less memory held."""

import pytest
import torch

from attnkit.data.batch import Batch
from attnkit.errors import AttnkitError
from attnkit.train.activation_checkpointing import apply_activation_checkpointing
from attnkit.train.objectives import objective_for
from bench.bench_fsdp import PeakTensorBytes
from tests.helpers import tiny_model


def forward_backward(mode: str) -> tuple[dict[str, torch.Tensor], int]:
    """Gradients of one language-model batch (dropout on) and the peak bytes it took."""
    model = tiny_model("decoder", layers=4, d_model=64, n_heads=4, d_ff=256, max_len=160)
    assert apply_activation_checkpointing(model, mode) == (0 if mode == "none" else 4)
    tokens = torch.randint(5, 24, (8, 160), generator=torch.Generator().manual_seed(0))
    batch = Batch(None, None, tokens, torch.ones_like(tokens, dtype=torch.bool))
    torch.manual_seed(1)  # the dropout masks
    with PeakTensorBytes() as memory:
        objective_for("decoder", 0.1)(model, batch).total.backward()
    return {name: p.grad for name, p in model.named_parameters()}, memory.peak


@pytest.fixture(scope="module")
def plain():
    return forward_backward("none")


@pytest.mark.parametrize("mode", ["block", "selective"])
def test_checkpointed_blocks_give_the_gradients_of_the_plain_forward(plain, mode):
    """The random state is restored before recomputing, so dropout draws the same masks."""
    grads, _ = forward_backward(mode)
    assert grads.keys() == plain[0].keys()
    assert all(torch.equal(grads[name], g) for name, g in plain[0].items())


def test_checkpointing_keeps_less_in_memory_the_less_it_saves(plain):
    """block keeps a Block's input alone, selective its products' outputs too; the peak
    counts the weights and gradients (about 0.9 MB here) as well as the activations."""
    block, selective = forward_backward("block")[1], forward_backward("selective")[1]
    assert block < 0.6 * plain[1]
    assert block < selective < 0.95 * plain[1]


def test_an_unknown_mode_is_refused():
    with pytest.raises(AttnkitError, match="activation_checkpointing 'layer' is not one"):
        apply_activation_checkpointing(tiny_model(), "layer")
