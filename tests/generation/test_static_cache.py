"""The static cache: the same tokens as the dynamic one on every model shape, one graph a step."""

from __future__ import annotations

import collections
from collections.abc import Callable

import pytest
import torch
from torch._functorch.aot_autograd import aot_module_simplified

from attnkit.generation import generate, static_cache
from attnkit.generation.config import resolve
from attnkit.generation.state import prefill
from attnkit.nn.kv_cache import KVCache
from tests.helpers import ATTENTION_VARIANTS, peaked, source_batch

VARIANTS = {
    **ATTENTION_VARIANTS,
    "strided window": {"attention_window": 3, "attention_stride": 2},
}


@pytest.fixture(autouse=True)
def nothing_kept():
    """Each test starts and ends without buffers kept from another test's decodings."""
    static_cache.release_all()
    yield
    static_cache.release_all()


@pytest.fixture
def eager_step(monkeypatch) -> list[int]:
    """The static cache without compilation: what the compiled step computes, quickly. Lists
    the batch size of every static cache made, so a test sees that one was."""
    monkeypatch.setattr(static_cache, "_compiled", lambda kind: kind.decode_step)
    made, take_over = [], static_cache.StaticKVCache.from_cache.__func__

    def counted(cls, cache):
        made.append(cache.batch_size)
        return take_over(cls, cache)

    monkeypatch.setattr(static_cache.StaticKVCache, "from_cache", classmethod(counted))
    return made


@pytest.fixture
def reused_here(monkeypatch) -> None:
    """Buffers kept on the CPU too, as on a GPU, where a CUDA graph replays on them."""
    monkeypatch.setattr(static_cache, "REUSED_ON", frozenset({"cpu", "cuda"}))


@pytest.fixture
def stepped_keys(monkeypatch) -> list[torch.Tensor]:
    """The first layer's keys tensor of every step a static cache takes, in order."""
    keys, update = [], static_cache.StaticLayerKV.update

    def recorded(layer, k, v):
        if layer.index == 0:
            keys.append(layer.cache.keys[0])
        return update(layer, k, v)

    monkeypatch.setattr(static_cache.StaticLayerKV, "update", recorded)
    return keys


@pytest.mark.parametrize("inference_mode", [False, True])
@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("shape", ["decoder", "encoder-decoder"])
def test_the_next_decoding_of_a_shape_steps_on_the_last_ones_buffers(
    eager_step, reused_here, stepped_keys, shape, num_beams, inference_mode
):
    # A CUDA graph replays on the addresses it was recorded on: new buffers at every call would
    # record a graph a call. The other prompts differ: nothing of one decoding leaks into the
    # next. Buffers made under inference_mode serve a decoding outside it, and the reverse.
    model = peaked(shape)
    ids, mask = source_batch()
    prompts = [(ids, mask), ((ids.flip(0) + 1) % model.config.vocab_size, mask.flip(0))] * 2
    options = {"max_new_tokens": 8, "num_beams": num_beams}
    last = []
    for i, (x, x_mask) in enumerate(prompts):
        dynamic = generate(model, x, x_mask, **options)
        with torch.inference_mode(inference_mode == (i % 2 == 0)):
            static = generate(model, x, x_mask, cache_implementation="static", **options)
        assert torch.equal(static.sequences, dynamic.sequences)
        last.append(stepped_keys[-1])  # what the last step ran on: for a search, the beams'
    assert len(eager_step) == len(prompts) and len(stepped_keys) > 4 * len(prompts)
    assert all(keys is last[0] for keys in last)


def test_greedy_and_beam_decodings_taking_turns_each_keep_their_buffers(
    eager_step, reused_here, stepped_keys
):
    model = peaked("decoder")
    ids, mask = source_batch()
    last = {1: [], 3: []}
    # Three shapes: the greedy rows, the search's sentence rows (another length), its beams.
    for num_beams in (1, 3) * 3:
        options = {"num_beams": num_beams, "max_new_tokens": 4 + num_beams}
        generate(model, ids, mask, cache_implementation="static", **options)
        last[num_beams].append(stepped_keys[-1])
    for keys in last.values():
        assert all(k is keys[0] for k in keys)
    assert last[1][0] is not last[3][0]


SIZES = {"n_layers": 2, "batch_size": 3, "n_kv_heads": 2, "d_head": 4, "capacity": 5}


def test_buffers_go_to_one_decoding_at_a_time_zeroed_and_only_the_last_shapes_stay(reused_here):
    first, second = (static_cache.StaticKVCache(**SIZES) for _ in range(2))
    assert first.keys[0] is not second.keys[0]  # both in use: each has its own
    keys = first.keys
    keys[1].fill_(7.0)
    first.key_mask.fill_(True)
    first.slot += 3
    first.release()
    first.release()  # once only: a second release keeps nothing twice
    assert first.keys == []  # a released cache can no longer write into kept buffers
    with pytest.raises(AttributeError):
        first.extend(None, 1)
    third = static_cache.StaticKVCache(**SIZES)
    assert third.keys[1] is keys[1] and not third.keys[1].any()
    assert not third.key_mask.any() and int(third.slot) == 0
    assert static_cache.StaticKVCache(**SIZES).keys[0] is not keys[0]  # taken: not twice
    third.release()
    for batch in (4, 5, 6):  # three other shapes, released after: the first is let go
        static_cache.StaticKVCache(**{**SIZES, "batch_size": batch}).release()
    assert static_cache.KEEP == 3
    assert static_cache.StaticKVCache(**SIZES).keys[0] is not keys[0]
    kept = static_cache.StaticKVCache(**{**SIZES, "batch_size": 5})
    kept_keys = kept.keys
    kept.release()
    static_cache.release_all()
    assert static_cache.StaticKVCache(**{**SIZES, "batch_size": 5}).keys[0] is not kept_keys[0]


def test_nothing_is_kept_on_a_cpu_nor_from_a_decoding_under_autograd(reused_here, monkeypatch):
    cache = static_cache.StaticKVCache(**SIZES)
    keys = cache.keys
    keys[0].index_copy_(2, torch.tensor([0]), torch.ones(3, 2, 1, 4, requires_grad=True))
    cache.release()  # its buffers hold an autograd graph
    assert static_cache.StaticKVCache(**SIZES).keys[0] is not keys[0]
    monkeypatch.setattr(static_cache, "REUSED_ON", frozenset({"cuda"}))  # as shipped
    cache = static_cache.StaticKVCache(**SIZES)
    keys = cache.keys
    cache.release()  # no CUDA graph replays on a CPU: nothing to keep the memory for
    assert static_cache.StaticKVCache(**SIZES).keys[0] is not keys[0]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("shape", ["decoder", "encoder-decoder"])
def test_greedy_decoding_gives_the_dynamic_caches_tokens(eager_step, shape, variant):
    model = peaked(shape, **VARIANTS[variant])
    ids, mask = source_batch()
    options = {"max_new_tokens": 12}
    dynamic = generate(model, ids, mask, **options).sequences
    assert not eager_step
    static = generate(model, ids, mask, cache_implementation="static", **options).sequences
    assert eager_step == [len(ids)]  # the static cache decoded (a decoder's crop included)
    assert torch.equal(static, dynamic)


@pytest.mark.parametrize("shape", ["decoder", "encoder-decoder"])
def test_the_static_state_keeps_every_row_and_matches_the_dynamic_logits(eager_step, shape):
    model = peaked(shape)
    ids, mask = source_batch()
    cfg = resolve(None, {"max_new_tokens": 6}, model.config)
    dynamic = prefill(model, ids, mask, cfg)[0]
    static = prefill(
        model, ids, mask, resolve(cfg, {"cache_implementation": "static"}, model.config)
    )[0]
    # An encoder-decoder's decoding state holds the static keys and values in its kv_cache.
    held = static.cache.kv_cache if shape == "encoder-decoder" else static.cache
    assert static.static and isinstance(held, static_cache.StaticKVCache)
    torch.testing.assert_close(static.logits, dynamic.logits, atol=1e-5, rtol=1e-5)
    for _ in range(5):
        nxt = dynamic.logits.argmax(-1)[:, None]
        torch.testing.assert_close(static.step(nxt), dynamic.step(nxt), atol=1e-5, rtol=1e-5)
    assert held.batch_size == len(ids)


@pytest.mark.parametrize("variant", ["plain", "gqa", "rope"])
@pytest.mark.parametrize("shape", ["decoder", "encoder-decoder"])
def test_beam_search_gives_the_dynamic_caches_hypotheses(eager_step, shape, variant, monkeypatch):
    model = peaked(shape, **VARIANTS[variant])
    ids, mask = source_batch()
    # Three end ids and early stopping: sentences finish at different steps.
    options = {"num_beams": 3, "num_return_sequences": 2, "max_new_tokens": 20}
    options |= {"eos_token_id": (2, 5, 9), "early_stopping": True}
    dropped = []  # the dynamic search drops a finished sentence; the static one decodes it on
    reorder = KVCache.reorder
    monkeypatch.setattr(
        KVCache,
        "reorder",
        lambda c, i, memory=True: dropped.append(memory) or reorder(c, i, memory),
    )
    dynamic = generate(model, ids, mask, **options)
    assert any(dropped)
    static = generate(model, ids, mask, cache_implementation="static", **options)
    assert eager_step == [len(ids)]
    assert torch.equal(static.sequences, dynamic.sequences)
    torch.testing.assert_close(static.sequences_scores, dynamic.sequences_scores)


def test_finished_rows_yield_padding_and_the_decode_ends_when_all_have(eager_step):
    model = peaked("decoder")
    ids, mask = source_batch()
    options = {"max_new_tokens": 30}
    dynamic = generate(model, ids, mask, **options)
    static = generate(model, ids, mask, cache_implementation="static", **options)
    assert torch.equal(static.sequences, dynamic.sequences)
    new = static.sequences[:, ids.shape[1] :]
    ended = (new == 2).int().cumsum(1) > 0  # at or after a row's first EOS
    after = ended & (ended.int().cumsum(1) > 1)
    assert after.any() and (new[after] == model.config.pad_id).all()
    # Every row ends at once: the static loop stops at its first look, as the dynamic one does.
    every_id = tuple(range(model.config.vocab_size))
    ended = generate(model, ids, mask, cache_implementation="static", eos_token_id=every_id)
    assert ended.sequences.shape[1] == ids.shape[1] + 1


def test_a_decode_that_slides_past_max_len_stays_dynamic_and_says_so(eager_step, caplog):
    model = peaked("decoder", max_len=12)
    ids, mask = source_batch()  # 7 tokens: 9 new ones slide past max_len 12, as nanoGPT's crop
    options = {"max_new_tokens": 9, "cache_implementation": "static"}
    dynamic = generate(model, ids, mask, max_new_tokens=9).sequences
    assert torch.equal(generate(model, ids, mask, **options).sequences, dynamic)
    assert not eager_step
    assert "slides past them; decoding on the dynamic cache" in caplog.text
    generate(model, ids, mask, **{**options, "max_new_tokens": 5})  # fits: static
    assert eager_step == [len(ids)]


@pytest.mark.parametrize(
    "changes",
    [
        {"attention_window": 3},
        {"copy_attention": "mean", "unk_id": 3},
        {"attention_kind": "location-aware"},
    ],
)
def test_caches_it_cannot_stand_in_for_stay_dynamic_and_say_so(eager_step, changes, caplog):
    shape = "decoder" if "attention_window" in changes else "encoder-decoder"
    model = peaked(shape, **changes)
    ids, mask = source_batch()
    cfg = resolve(None, {"max_new_tokens": 4, "cache_implementation": "static"}, model.config)
    state = prefill(model, ids, mask, cfg)[0]
    # a ring window, a copy mechanism, carried alignments: the dynamic cache decodes
    assert not state.static
    assert "decoding on the dynamic cache" in caplog.text


# 16 beams of 4 rows in 2 heads are 128 rows a query: there a CPU takes the plain products, whose
# check for queries that see no key once ended the graph (the fused kernel, 2 beams, has none).
@pytest.mark.parametrize("beams", [2, 16])
@pytest.mark.parametrize("shape", ["decoder", "encoder-decoder"])
def test_a_decoding_step_on_the_static_cache_compiles_to_one_graph(shape, beams):
    model = peaked(shape)
    ids, mask = source_batch()
    cfg = resolve(None, {"max_new_tokens": 8}, model.config)
    cache = prefill(model, ids, mask, cfg)[0].cache
    static = static_cache.static_like(cache)
    held = static.kv_cache if shape == "encoder-decoder" else static  # the static keys, values
    model.decode_step(torch.ones(len(ids), 3, dtype=torch.long), static)  # a prefix, eagerly
    static.repeat_rows(beams)  # beams of a row, as beam search makes them before its first step
    rows = beams * len(ids)
    torch._dynamo.reset()
    step = torch.compile(type(model).decode_step, backend="eager", fullgraph=True)
    # dynamo's own patch, not monkeypatch: pytest 9.2's undo deletes the config attribute, so
    # every later case failed with AttributeError.
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):  # the same graph each step: the slot is a tensor, not a number
            keys = held.keys[0]
            static.reorder(torch.arange(rows).flip(0), memory=False)  # beams follow parents
            assert held.keys[0] is keys
            step(model, torch.ones(rows, 1, dtype=torch.long), static)
    assert int(held.slot) == 6


@pytest.mark.parametrize("shape", ["decoder", "encoder-decoder"])
def test_a_compiled_step_copies_into_each_layers_slot_and_scatters_no_whole_buffer(shape):
    # Keys and values held as slices of one buffer were written, once functionalized, as
    # `select_scatter`s that rewrite the whole buffer at every layer: a step cost the cache's
    # size times the layers (0.47x transformers at batch 64 on an H100). The graph torch.compile
    # hands its compiler must write each layer's keys and values in place, at the slot.
    layers = 3
    model = peaked(shape, n_decoder_layers=layers)
    ids, mask = source_batch()
    cfg = resolve(None, {"max_new_tokens": 4}, model.config)
    static = static_cache.static_like(prefill(model, ids, mask, cfg)[0].cache)
    model.decode_step(torch.ones(len(ids), 1, dtype=torch.long), static)
    ops = collections.Counter()

    def recorded(graph: torch.fx.GraphModule, _) -> torch.fx.GraphModule:
        ops.update(str(n.target) for n in graph.graph.nodes if n.op == "call_function")
        return graph

    def backend(graph: torch.fx.GraphModule, inputs: list) -> Callable:
        return aot_module_simplified(graph, inputs, fw_compiler=recorded)

    torch._dynamo.reset()
    step = torch.compile(type(model).decode_step, backend=backend, fullgraph=True)
    with torch.no_grad():
        step(model, torch.ones(len(ids), 1, dtype=torch.long), static)
    assert not [op for op in ops if "scatter" in op]
    assert ops["aten.index_copy.default"] == 2 * layers + 1  # keys, values; the key mask


def test_auto_takes_the_static_cache_on_a_cuda_device_and_the_dynamic_one_elsewhere():
    """The resolution alone, for a CUDA device this machine need not have."""
    assert static_cache.chosen("auto", torch.device("cuda")) == "static"
    assert static_cache.chosen("auto", "cuda:1") == "static"
    assert static_cache.chosen("auto", "cpu") == "dynamic"
    assert static_cache.chosen("auto", "mps") == "dynamic"
    assert static_cache.chosen("dynamic", "cuda") == "dynamic"  # asked for: as asked
    assert static_cache.chosen("static", "cpu") == "static"


def test_the_default_is_auto_and_on_the_cpu_decodes_quietly_on_the_dynamic_cache(caplog):
    model = peaked("decoder")
    ids, mask = source_batch()
    cfg = resolve(None, {"max_new_tokens": 4}, model.config)
    assert cfg.cache_implementation == "auto"
    assert not prefill(model, ids, mask, cfg)[0].static
    assert "dynamic cache" not in caplog.text


def test_auto_where_the_static_cache_does_not_serve_is_dynamic_without_a_warning(
    eager_step, monkeypatch, caplog
):
    """`auto` as on a CUDA device (the resolution made to say static), for a ring window: the
    dynamic cache, quietly, and the same tokens as asked for dynamic."""
    monkeypatch.setattr(static_cache, "chosen", lambda asked, device: "static")
    model = peaked("decoder", attention_window=3)
    ids, mask = source_batch()
    cfg = resolve(None, {"max_new_tokens": 4}, model.config)
    assert not prefill(model, ids, mask, cfg)[0].static
    assert "dynamic cache" not in caplog.text
    auto = generate(model, ids, mask, max_new_tokens=6).sequences
    assert torch.equal(auto, generate(model, ids, mask, max_new_tokens=6,
                                      cache_implementation="dynamic").sequences)  # fmt: skip


@pytest.mark.parametrize("shape", ["decoder", "encoder-decoder"])
def test_auto_on_a_cuda_device_decodes_the_dynamic_caches_greedy_tokens(
    eager_step, monkeypatch, shape
):
    """`auto` resolved as on a CUDA device (static): the static cache is taken, and its greedy
    tokens in float32 are the dynamic cache's."""
    monkeypatch.setattr(static_cache, "chosen", lambda asked, device: "static")
    model = peaked(shape)
    ids, mask = source_batch()
    cfg = resolve(None, {"max_new_tokens": 6}, model.config)
    state = prefill(model, ids, mask, cfg)[0]
    assert state.static
    state.close()
    auto = generate(model, ids, mask, max_new_tokens=6).sequences
    dynamic = generate(model, ids, mask, max_new_tokens=6, cache_implementation="dynamic")
    assert torch.equal(auto, dynamic.sequences)


@pytest.mark.parametrize("do_sample", [False, True])
def test_auto_past_max_len_fills_the_static_cache_then_crops_on_the_dynamic_one(
    eager_step, monkeypatch, do_sample
):
    """`attnkit generate`'s default asks for max_len - 1 new tokens after the prompt, past the
    context: `auto` (as on a CUDA device) decodes on the static cache until it is full, then
    goes on cropped on the dynamic one, and the tokens (greedy, or drawn with one seed) are
    the dynamic cache's all the way."""
    monkeypatch.setattr(static_cache, "chosen", lambda asked, device: "static")
    model = peaked("decoder", max_len=12)
    ids, mask = source_batch()
    options = {"max_new_tokens": 14, "eos_token_id": (), "do_sample": do_sample, "seed": 5}
    auto = generate(model, ids, mask, **options).sequences
    assert eager_step  # a static cache was made
    dynamic = generate(model, ids, mask, cache_implementation="dynamic", **options).sequences
    assert torch.equal(auto, dynamic)
