"""Decoding under a monotonic window (`GenerationConfig.monotonic_window`): every strategy,
against unconstrained decoding and an independent step-by-step reference, and its refusals."""

import pytest
import torch

from attnkit import AttnkitError
from attnkit.cli import main
from attnkit.generation import GenerationConfig, generate
from attnkit.inference import translate
from attnkit.run import load_run
from tests.helpers import DECODING, RUN_LINES, padded_batch, tiny_model

STRATEGIES = {
    "greedy": {},
    "beam": {"num_beams": 3},
    "sampling": {"do_sample": True, "seed": 7, "top_k": 10},
}


def model_and_sources(left: bool = False, **changes):
    """A random two-layer encoder-decoder (no dropout) and four padded sources of it.

    Its last cross-attention and its output are sharpened, so that where it attends shows
    in what it decodes.
    """
    model = tiny_model(
        "encoder-decoder", seed=3, **DECODING, decoder_start_id=1, eos_id=2, **changes
    ).eval()
    with torch.no_grad():
        model.decoder.blocks[-1].cross_attn.q_proj.weight.mul_(3)
        model.head.weight.mul_(3)
    torch.manual_seed(1)
    src, mask = padded_batch([7, 4, 2, 5], 7)
    if left:
        src, mask = src.flip(-1), mask.flip(-1)
    return model, src, mask


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_window_over_the_whole_source_decodes_as_no_window(strategy):
    model, src, mask = model_and_sources()
    options = {"max_new_tokens": 10, **STRATEGIES[strategy]}
    free = generate(model, src, mask, **options)
    wide = generate(model, src, mask, monotonic_window=(7, 7), **options)
    assert torch.equal(free.sequences, wide.sequences)
    if strategy == "beam":
        torch.testing.assert_close(free.sequences_scores, wide.sequences_scores)


def test_a_narrow_window_changes_what_is_decoded():
    model, src, mask = model_and_sources()
    free = generate(model, src, mask, max_new_tokens=10, eos_token_id=())
    narrow = generate(model, src, mask, max_new_tokens=10, eos_token_id=(), monotonic_window=(0, 1))
    assert not torch.equal(free.sequences, narrow.sequences)


class CrossWeights:
    """Records each step's cross-attention weights (batch, heads, 1, S) of every decoder layer.

    The hook reruns the layer for its weights; the window is fixed for the whole step, and
    the last layer moves the focus to the same place again, so the decode is unchanged.
    """

    def __init__(self, model) -> None:
        self.steps: list[list[torch.Tensor]] = []
        self.handles = []
        blocks = model.decoder.blocks
        for i, block in enumerate(blocks):
            self.handles.append(block.cross_attn.register_forward_hook(self.hook(i == 0)))

    def hook(self, first: bool):
        def record(module, args, output):
            x, inputs, cache = args[:3]
            if first:
                self.steps.append([])
            self.steps[-1].append(module.forward(x, inputs, cache, True)[1])

        return record

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@pytest.mark.parametrize(("back", "ahead"), [(0, 1), (1, 2), (2, 1)])
def test_attention_stays_in_the_window_and_the_focus_never_falls_behind_it(back, ahead):
    model, src, mask = model_and_sources()
    recorder = CrossWeights(model)
    generate(
        model,
        src,
        mask,
        max_new_tokens=12,
        eos_token_id=(),  # no row leaves, so row i is sentence i at every step
        monotonic_window=(back, ahead),
    )
    recorder.remove()
    assert len(recorder.steps) == 12
    focus = torch.zeros(4, dtype=torch.long)
    positions = torch.arange(7)
    moved = False
    for layers in recorder.steps:
        lo, hi = focus - back, focus + ahead
        window = mask & (positions >= lo[:, None]) & (positions <= hi[:, None])
        for weights in layers:
            assert torch.all(weights[:, :, 0].masked_fill(window[:, None], 0) == 0)
        new = layers[-1][:, :, 0].mean(1).argmax(-1)
        assert torch.all(new >= focus - back) and torch.all(new <= focus + ahead)
        moved |= bool((new != focus).any())
        focus = new
    assert moved


@torch.no_grad()
def reference_greedy(model, src, mask, back, ahead, steps):
    """Greedy decoding on a cache without a window, each step's memory mask set by hand to
    the window of a focus tracked here from the last layer's weights."""
    cache = model.new_cache(src, mask, capacity=steps)
    position = mask.long().cumsum(-1) - 1
    focus = torch.zeros(src.shape[0], dtype=torch.long)
    last = model.decoder.blocks[-1].cross_attn
    weights = []
    handle = last.register_forward_hook(
        lambda module, args, output: weights.append(module.forward(*args[:3], True)[1])
    )
    ids = torch.full((src.shape[0], 1), 1)
    out, all_logits = [], []
    for _ in range(steps):
        window = mask & (position >= focus[:, None] - back) & (position <= focus[:, None] + ahead)
        cache.kv_cache.memory_mask = window[:, None, None]
        logits = model.decode_step(ids, cache)
        slot = weights[-1][:, :, -1].mean(1).argmax(-1, keepdim=True)
        focus = position.gather(1, slot).squeeze(1)
        ids = logits.argmax(-1, keepdim=True)
        out.append(ids)
        all_logits.append(logits)
    handle.remove()
    return torch.cat(out, 1), all_logits


@pytest.mark.parametrize("left", [False, True])
@torch.no_grad()
def test_cached_decoding_with_a_window_equals_a_reference(left):
    model, src, mask = model_and_sources(left=left)
    expected, reference_logits = reference_greedy(model, src, mask, 1, 1, 12)
    decoded = generate(
        model, src, mask, max_new_tokens=12, eos_token_id=(), monotonic_window=(1, 1)
    )
    assert torch.equal(decoded.sequences[:, 1:], expected)
    # And step by step on the windowed cache, reading the same tokens, the same logits.
    cache = model.new_cache(src, mask, capacity=12)
    cache.set_monotonic(1, 1)
    ids = torch.full((4, 1), 1)
    for step, logits in enumerate(reference_logits):
        torch.testing.assert_close(model.decode_step(ids, cache), logits, atol=1e-5, rtol=0)
        ids = expected[:, step : step + 1]


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_each_source_decodes_alone_as_in_a_padded_batch(strategy):
    """The windows of rows, and of the beams that share a sentence's memory, stay apart."""
    model, src, mask = model_and_sources()
    options = {"max_new_tokens": 10, "monotonic_window": (1, 1), **STRATEGIES[strategy]}
    batched = generate(model, src, mask, **options).new_tokens()
    for row in range(4):
        alone = src[row : row + 1, : int(mask[row].sum())]
        assert generate(model, alone, **options).new_tokens() == [batched[row]]


@pytest.mark.parametrize("strategy", ["beam", "sampling"])
def test_every_strategy_attends_within_a_window_of_the_width_asked(strategy):
    """Beams move and rows finish, so each step's attention is checked for its span alone."""
    model, src, mask = model_and_sources()
    recorder = CrossWeights(model)
    options = {"max_new_tokens": 10, **STRATEGIES[strategy]}
    generate(model, src, mask, monotonic_window=(1, 1), **options)
    recorder.remove()
    assert len(recorder.steps) > 2
    for layers in recorder.steps:
        for weights in layers:
            seen = weights[:, :, 0].sum(1) > 0  # (rows, source): where any head attends
            first = seen.float().argmax(-1)
            last = seen.shape[1] - 1 - seen.flip(-1).float().argmax(-1)
            assert torch.all(last - first <= 2)


def test_a_pointer_generator_decodes_with_a_window():
    model, src, mask = model_and_sources(copy_attention="mean", unk_id=3)
    free = generate(model, src, mask, max_new_tokens=8, num_beams=2)
    wide = generate(model, src, mask, max_new_tokens=8, num_beams=2, monotonic_window=(7, 7))
    assert torch.equal(free.sequences, wide.sequences)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"monotonic_window": (1, 1), "use_cache": False},
            "monotonic_window moves its focus on the KV cache, which use_cache=False turns off; "
            "set use_cache=True",
        ),
        ({"monotonic_window": (-1, 2)}, "monotonic_window must be two integers, back of zero"),
        ({"monotonic_window": (2, 0)}, "ahead of one or more"),
        ({"monotonic_window": (1,)}, r"\(back, ahead\), got \(1,\)"),
        ({"monotonic_window": 3}, "got 3$"),
        ({"monotonic_window": (1.5, 2)}, "monotonic_window must be two integers"),
    ],
)
def test_bad_windows_are_refused_in_one_sentence(options, message):
    with pytest.raises(AttnkitError, match=message):
        GenerationConfig(**options)


def test_a_window_is_refused_for_a_model_without_a_source():
    decoder = tiny_model("decoder", **DECODING)
    with pytest.raises(AttnkitError, match="but a decoder model has no source; leave it None"):
        generate(decoder, torch.ones(1, 2, dtype=torch.long), monotonic_window=(1, 1))
    assert GenerationConfig(monotonic_window=[1, 2]).monotonic_window == (1, 2)


def test_translate_takes_the_window_from_the_command_line(mt_run, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("\n".join(RUN_LINES) + "\n")
    args = ["translate", str(mt_run), "--input", str(source), "--max-new-tokens", "8"]
    assert main([*args, "--monotonic-window", "0", "1", "--beam", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    run = load_run(mt_run)
    config = GenerationConfig(max_new_tokens=8, num_beams=2, monotonic_window=(0, 1))
    assert out == translate(run.model, run.tokenizer, RUN_LINES, config)


def test_the_command_line_refuses_a_window_for_a_language_model(lm_run, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("a dog\n")
    args = ["translate", str(lm_run), "--input", str(source), "--monotonic-window", "1", "1"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "attnkit: error: --monotonic-window keeps cross-attention near a focus moving along "
        "the source, but this run is a decoder model, which has no source"
    )
