"""Segment recurrence (Transformer-XL): the memory is the previous segment's layer inputs, the
gradient stops at it, a segment after its memory computes what full causal attention over both
computes, and models that cannot carry a memory are refused."""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import AttnkitError
from attnkit.models.segment_memory import forward_segment, forward_segments
from tests.helpers import tiny_model

ROPE = {"positional": "rope", "max_len": 64, "dropout": 0.0, "embedding_dropout": 0.0}


def _model(**changes):
    return tiny_model("decoder", layers=2, **{**ROPE, **changes})


def test_the_memory_is_each_layers_input_from_the_previous_segment() -> None:
    model = _model().eval()
    ids = torch.randint(24, (2, 8))
    seen: list[torch.Tensor] = []
    hooks = [
        block.register_forward_pre_hook(lambda _, args: seen.append(args[0].detach().clone()))
        for block in model.decoder.blocks
    ]
    _, memory = forward_segment(model, ids)
    for hook in hooks:
        hook.remove()
    assert len(memory) == len(model.decoder.blocks) == len(seen)
    for kept, read in zip(memory, seen, strict=True):
        torch.testing.assert_close(kept, read)  # no memory before: each block read the segment
    _, short = forward_segment(model, ids, mem_len=3)
    for kept, read in zip(short, seen, strict=True):
        torch.testing.assert_close(kept, read[:, -3:])


def test_the_gradient_stops_at_the_memory() -> None:
    model = _model()
    first, second = torch.randint(24, (2, 8)), torch.randint(24, (2, 8))
    _, memory = forward_segment(model, first)
    assert not any(m.requires_grad for m in memory)
    leaves = [m.clone().requires_grad_(True) for m in memory]
    out, _ = forward_segment(model, second, leaves)
    out.logits.sum().backward()
    assert all(m.grad is None for m in leaves)  # nothing flows back into the memory


def test_no_gradient_reaches_the_tokens_of_the_previous_segment() -> None:
    """Untied, the embedding's rows get gradient only through the input: a token seen only in
    the first segment gets none from the second segment's loss."""
    model = _model(tie_embeddings="none")
    first, second = torch.randint(24, (2, 8)), torch.randint(24, (2, 8))
    _, memory = forward_segment(model, first)
    out, _ = forward_segment(model, second, memory)
    out.logits.sum().backward()
    grad = model.embed.token.weight.grad
    only_first = sorted(set(first.flatten().tolist()) - set(second.flatten().tolist()))
    assert only_first and grad[only_first].abs().max() == 0
    assert grad[second.flatten()].abs().sum() > 0


def test_a_segment_after_its_memory_is_full_causal_attention_over_both() -> None:
    """With mem_len = n, segment 2's outputs are those of one causal pass over segments 1 and
    2 (each position of segment 1 only ever saw segment 1); positions are relative (RoPE)."""
    model = _model().eval()
    ids = torch.randint(24, (3, 16))
    logits, _ = forward_segments(model, ids, segment=8)
    torch.testing.assert_close(logits, model(ids).logits, atol=1e-5, rtol=1e-5)


def test_the_third_segment_reaches_the_first_only_through_the_memory() -> None:
    model = _model().eval()
    ids = torch.randint(24, (1, 24))
    changed = ids.clone()
    changed[0, 0] = (ids[0, 0] + 1) % 24
    one_layer = tiny_model("decoder", layers=1, **ROPE).eval()
    # one layer sees one segment back: the first segment cannot reach the third
    a, _ = forward_segments(one_layer, ids, segment=8)
    b, _ = forward_segments(one_layer, changed, segment=8)
    torch.testing.assert_close(a[:, 16:], b[:, 16:])
    # two layers see two segments back: it can
    a, _ = forward_segments(model, ids, segment=8)
    b, _ = forward_segments(model, changed, segment=8)
    assert (a[:, 16:] - b[:, 16:]).abs().max() > 1e-4


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"positional": "sinusoidal"}, "relative positions"),
        ({"positional": "learned"}, "relative positions"),
        ({"attention_window": 4}, "attention_window"),
    ],
)
def test_models_that_cannot_carry_a_memory_are_refused(changes: dict, match: str) -> None:
    model = _model(**changes)
    with pytest.raises(AttnkitError, match=match):
        forward_segment(model, torch.randint(24, (1, 4)))


def test_a_memory_and_segment_past_max_len_are_refused() -> None:
    model = _model(max_len=12)
    _, memory = forward_segment(model, torch.randint(24, (1, 8)))
    with pytest.raises(AttnkitError, match="max_len"):
        forward_segment(model, torch.randint(24, (1, 8)), memory)
