"""Paged KV memory: the dynamic cache's tokens and logits, blocks that follow the tokens in flight
and come back when rows leave, and one compiled step for each batch size that rows joining and
leaving never recompile (inductor on the CPU)."""

from __future__ import annotations

import math
import time
import types

import pytest
import torch

from attnkit.generation import GenerationConfig, generate, paged_cache, static_cache
from attnkit.generation.batching import Scheduler
from attnkit.generation.paged_cache import PagedMemory, PagedRow, sizes
from attnkit.generation.paged_rows import Ledger
from attnkit.generation.rows import Failed, Finish, Piece, Sequence
from attnkit.generation.state import left_pad
from attnkit.models.decoding_state import DecodingState
from attnkit.nn.kv_cache import KVCache
from tests.helpers import ATTENTION_VARIANTS, peaked, served_models, source_batch

VARIANTS = {
    **ATTENTION_VARIANTS,
    "xpos": {"positional": "xpos"},
    "t5": {"positional": "t5-relative"},
}


PROMPTS = ["a dog", "the cat sleeps", "zwei", "a", "ein hund läuft im park"]


@pytest.fixture
def eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Paged steps uncompiled: what the compiled step computes, quickly."""
    monkeypatch.setattr(paged_cache, "_compiled", lambda: paged_cache.step)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, types.SimpleNamespace]:
    return served_models(tmp_path_factory.mktemp("runs"))


def _ids(served: types.SimpleNamespace, text: str) -> list[int]:
    return served.tokenizer.encode(text, add_eos=served.model.config.shape != "decoder")


def _alone(served: types.SimpleNamespace, ids: list[int], max_new_tokens: int) -> list[int]:
    config = GenerationConfig(
        eos_token_id=served.model.config.eos_id, max_new_tokens=max_new_tokens
    )
    return generate(served.model, torch.tensor([ids]), config=config).new_tokens()[0]


def _texts(
    scheduler: Scheduler, outputs: list[tuple[types.SimpleNamespace, list[int], GenerationConfig]]
) -> list[str]:
    """Each output's text, the outputs added one by one a little apart, so that they join the
    running rows at different steps."""
    events: dict[int, list] = {i: [] for i in range(len(outputs))}
    try:
        for i, (served, ids, config) in enumerate(outputs):
            scheduler.add([Sequence(served, ids, config, events[i].append)])
            time.sleep(0.01)
        deadline = time.monotonic() + 60
        while not all(e and isinstance(e[-1], Finish | Failed) for e in events.values()):
            assert time.monotonic() < deadline, events
            time.sleep(0.01)
    finally:
        scheduler.shutdown()
    assert all(isinstance(e[-1], Finish) for e in events.values()), events
    return ["".join(e.text for e in got if isinstance(e, Piece)) for got in events.values()]


def _prefill(model, ids: torch.Tensor, mask: torch.Tensor) -> tuple[KVCache, torch.Tensor]:
    """The dynamic cache after a batch's prompts (a decoder's) or start tokens (an
    encoder-decoder's, over its sources), and the logits of its last tokens."""
    if model.config.shape == "decoder":
        ids, mask = left_pad(ids, mask)
        cache = model.new_cache(ids, mask, model.config.max_len)
        return cache, model.decode_step(ids, cache, mask)
    state = model.new_cache(ids, mask, model.config.max_len)
    start = torch.ones(len(ids), 1, dtype=torch.long)
    return state.kv_cache, model.decode_step(start, state)


def _dynamic_step(model, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
    if model.config.shape == "decoder":
        return model.decode_step(ids, cache)
    return model.decode_step(ids, DecodingState(cache))


def _held(memory: PagedMemory, rows: list[PagedRow]) -> int:
    return sum(math.ceil(r.length / memory.block) for r in rows)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("shape", ["decoder", "encoder-decoder"])
def test_paged_steps_give_the_dynamic_caches_logits_as_rows_leave(eager, shape, variant):
    """Four rows of prompts (or sources) of 7, 4, 2 and 5 tokens in blocks of 3 positions step
    on paged memory beside the dynamic cache, fed the same greedy tokens: the same logits at
    every step, row by row, as rows leave (the batch padded up to 4, 2, 1), and the blocks held
    are each row's ceil(length / 3), all back in the pool once the rows have left."""
    model = peaked(shape, max_len=22, **VARIANTS[variant])  # not a multiple of 3
    ids, mask = source_batch()
    with torch.no_grad():
        cache, logits = _prefill(model, ids, mask)
        memory = PagedMemory(model, cache, max_batch=4, block=3, compiled=False)
        full = len(memory.pool.free)
        rows = memory.add(cache)
        assert memory.pool.in_use == _held(memory, rows)
        for step in range(10):
            tokens = logits.argmax(-1)
            paged = memory.decode(rows, tokens.tolist())
            logits = _dynamic_step(model, tokens[:, None], cache)
            torch.testing.assert_close(paged, logits, atol=1e-5, rtol=1e-5)
            assert memory.pool.in_use == _held(memory, rows)
            if step in (3, 6, 8):  # a row leaves: its blocks go back
                gone = 1 if step == 3 else 0
                index = torch.tensor([i for i in range(len(rows)) if i != gone])
                memory.leave(rows.pop(gone))
                cache.reorder(index)
                logits = logits[index]
                assert memory.pool.in_use == _held(memory, rows)
        assert sorted(memory.steps) == [1, 2, 4]  # 3 rows padded up to 4
        memory.leave(rows.pop())
    assert memory.pool.in_use == 0 and len(memory.pool.free) == full
    if shape == "encoder-decoder":
        assert memory.sources.in_use == 0


@pytest.mark.parametrize(("shape", "max_tokens"), [("decoder", 30), ("encoder-decoder", 23)])
def test_rows_joining_and_leaving_on_paged_memory_decode_as_alone_and_as_the_dynamic_cache(
    eager, models: dict, shape: str, max_tokens: int
) -> None:
    """`cache_implementation="static"` on the CPU: the batching engine's rows decode on paged
    memory (blocks of 4 positions), five outputs joining a max_batch of 3 at different steps
    and leaving at steps of their own, the decoder's outrunning its max_len of 24 (the crop):
    each gets `generate`'s greedy tokens alone, and the dynamic path's; every block is back
    in the pool at the end."""
    served = models[shape]

    def decoded(cache_implementation: str) -> tuple[list[str], Scheduler]:
        scheduler = Scheduler(max_batch=3, block_size=4)
        outputs = [
            (
                served,
                _ids(served, prompt),
                GenerationConfig(
                    max_new_tokens=max_tokens - i, cache_implementation=cache_implementation
                ),
            )
            for i, prompt in enumerate(PROMPTS)
        ]
        return _texts(scheduler, outputs), scheduler

    paged, scheduler = decoded("static")
    dynamic, dynamic_scheduler = decoded("dynamic")
    assert not dynamic_scheduler.paged.memories()  # the CPU's default path is untouched
    [memory] = scheduler.paged.memories()
    assert memory.steps  # the paged path ran
    assert memory.pool.in_use == 0 and len(memory.pool.free) == memory.pool.blocks - 1
    for i, prompt in enumerate(PROMPTS):
        alone = _alone(served, _ids(served, prompt), max_new_tokens=max_tokens - i)
        assert paged[i] == dynamic[i] == served.tokenizer.decode(alone)


def test_rows_take_paged_memory_where_the_static_cache_is_chosen_and_rows_may_join(
    models: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU `auto` keeps the shared dynamic cache and `static` takes paged memory; on a
    CUDA device `auto` takes it; a ring window's rows decode in cohorts whatever is asked."""
    scheduler = Scheduler(max_batch=2)
    try:

        def kind(name: str, asked: str) -> object:
            served = models[name]
            config = GenerationConfig(max_new_tokens=2, cache_implementation=asked)
            return scheduler._batch_key(Sequence(served, _ids(served, "a"), config, print))[1]

        assert kind("decoder", "auto") == kind("encoder-decoder", "dynamic") == "shared"
        assert kind("decoder", "static") == kind("encoder-decoder", "static") == "paged"
        assert isinstance(kind("window", "static"), int)  # a cohort's number
        chosen = static_cache.chosen
        monkeypatch.setattr(static_cache, "chosen", lambda asked, device: chosen(asked, "cuda"))
        assert kind("decoder", "auto") == "paged"
    finally:
        scheduler.shutdown()


def test_rows_cancelled_or_failed_give_their_blocks_back(
    eager, models: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On paged memory a row whose client has gone leaves at the next step and the others end
    as usual; a step that fails fails its rows: each time every block is back in the pool."""
    served = models["decoder"]
    config = GenerationConfig(max_new_tokens=12, cache_implementation="static")
    scheduler = Scheduler(max_batch=4, block_size=4)
    events: dict[int, list] = {i: [] for i in range(3)}

    def emit(i: int):
        def put(event: object) -> None:
            events[i].append(event)
            if i == 1 and len(events[1]) == 2:  # its client goes after two pieces
                sequences[1].cancelled = True

        return put

    sequences = [
        Sequence(served, _ids(served, p), config, emit(i)) for i, p in enumerate(PROMPTS[:3])
    ]
    try:
        scheduler.add(sequences)
        deadline = time.monotonic() + 60
        while not all(e and isinstance(e[-1], Finish) for i, e in events.items() if i != 1):
            assert time.monotonic() < deadline, events
            time.sleep(0.01)
        [memory] = scheduler.paged.memories()
        _drained(memory, deadline)
        assert len(events[1]) == 2  # nothing after its client went

        def broken(model, ids, state):
            raise RuntimeError("the device is gone")

        monkeypatch.setattr(memory, "step", broken)
        failed = {i: [] for i in range(2)}
        scheduler.add([Sequence(served, _ids(served, p), config, failed[i].append)
                       for i, p in enumerate(PROMPTS[:2])])  # fmt: skip
        while not all(e and isinstance(e[-1], Failed) for e in failed.values()):
            assert time.monotonic() < deadline, failed
            time.sleep(0.01)
        _drained(memory, deadline)
    finally:
        scheduler.shutdown()


def _drained(memory: PagedMemory, deadline: float) -> None:
    """Every block back in the pool: the decoding thread gives a row's blocks back just after
    its last event, so the test's thread waits for it (bounded) rather than racing it."""
    while memory.pool.in_use:
        assert time.monotonic() < deadline, memory.pool.in_use
        time.sleep(0.01)


@pytest.mark.parametrize(("shape", "max_tokens"), [("decoder", 30), ("encoder-decoder", 23)])
def test_a_pool_smaller_than_max_batch_rows_of_max_len_decodes_every_row_as_alone(
    eager, models: dict, shape: str, max_tokens: int
) -> None:
    """Pools of 8 blocks of 4 positions (one row of max_len 24 takes 6) under a max_batch of 3:
    each output is promised the blocks it may hold and joins only while the promises fit, the
    others waiting; each gets `generate`'s tokens alone, and every block and promise is back at
    the end."""
    served = models[shape]
    scheduler = Scheduler(max_batch=3, block_size=4, kv_blocks=8)
    outputs = [
        (served, _ids(served, prompt), GenerationConfig(max_new_tokens=max_tokens - i,
                                                        cache_implementation="static"))
        for i, prompt in enumerate(PROMPTS)
    ]  # fmt: skip
    texts = _texts(scheduler, outputs)
    [memory] = scheduler.paged.memories()
    assert memory.pool.blocks == 9  # 8 and block 0
    [[_, ledger, _]] = scheduler.paged.kept.values()
    assert (ledger.free, ledger.promises) == (8, {})
    assert memory.pool.in_use == 0
    for i, prompt in enumerate(PROMPTS):
        alone = _alone(served, _ids(served, prompt), max_new_tokens=max_tokens - i)
        assert texts[i] == served.tokenizer.decode(alone)


def test_a_row_is_promised_the_blocks_its_longest_output_holds(models: dict) -> None:
    """A decoder's row: its prompt and max_new_tokens, up to max_len; an encoder-decoder's: its
    output (the start token and max_new_tokens, up to max_len) and its source, apart."""
    decoder = Ledger(models["decoder"].model.config, max_batch=2, block=4, blocks=None)
    assert decoder.free == 12  # 2 rows of 6 blocks
    assert decoder.need(5, 6) == (3, 0) and decoder.need(5, 30) == (6, 0)
    assert decoder.promise("a", 5, 30) and decoder.promise("b", 3, 5)
    assert decoder.free == 4 and not decoder.promise("c", 1, 20)  # 6 blocks: c waits
    assert not decoder.promise("d", 1, 1)  # d would fit, but c came first
    decoder.release("a")
    assert decoder.promise("c", 1, 20) and decoder.free == 4
    assert decoder.promise("d", 1, 1) and decoder.free == 3
    pair = Ledger(models["encoder-decoder"].model.config, max_batch=1, block=4, blocks=2)
    assert (pair.free, pair.source_free) == (6, 6)  # never less than one whole row
    assert pair.need(6, 23) == (6, 2) and pair.need(6, 3) == (1, 2)


def test_the_step_sizes_are_powers_of_two_up_to_the_most_rows() -> None:
    assert sizes(1) == [1]
    assert sizes(4) == [1, 2, 4]
    assert sizes(48) == [1, 2, 4, 8, 16, 32, 64]


def test_rows_joining_and_leaving_over_50_steps_never_recompile_the_step() -> None:
    """The step compiled by inductor on the CPU, once for each of the sizes 1, 2 and 4; then 50
    steps over which rows join (prefilled apart, their keys copied into blocks) and leave, the
    batch going through 1 to 4 rows, run with recompilation an error, and give the eager
    step's logits."""
    model = peaked("decoder", max_len=32)
    ids, mask = source_batch()
    torch._dynamo.reset()
    with torch.no_grad():
        cache, _ = _prefill(model, ids, mask)
        compiled = PagedMemory(model, cache, max_batch=4, block=4)
        eager = PagedMemory(model, cache, max_batch=4, block=4, compiled=False)
        assert compiled.step is not paged_cache.step
        for n in (1, 2, 4):  # the first compile of each size
            rows = compiled.add(cache)
            compiled.decode(rows[:n], [3] * n)
            for row in rows:
                compiled.leave(row)
        running: list[tuple[PagedRow, PagedRow, int]] = []
        joins = {0: [0], 3: [1, 2], 9: [3], 20: [0, 2], 31: [1], 40: [3, 0]}
        with torch._dynamo.config.patch(error_on_recompile=True):
            for step in range(50):
                for b in joins.get(step, []):  # one row of a fresh prefill joins
                    one = (ids[b : b + 1], mask[b : b + 1])
                    joined, _ = _prefill(model, *one)
                    running.append((compiled.add(joined)[0], eager.add(joined)[0], 3 + b))
                if step % 7 == 6 and running:  # the oldest row leaves
                    left, twin, _ = running.pop(0)
                    compiled.leave(left)
                    eager.leave(twin)
                if not running:
                    continue
                last = [token for _, _, token in running]
                got = compiled.decode([r for r, _, _ in running], last)
                expected = eager.decode([r for _, r, _ in running], last)
                torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
                running = [
                    (a, b, int(t)) for (a, b, _), t in zip(running, got.argmax(-1), strict=True)
                ]
    assert sorted(compiled.steps) == [1, 2, 4]
