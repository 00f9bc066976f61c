"""Continuous batching: outputs that join the running batch at different steps, leave it at
different steps, and outrun the context get, token for token, what `generate` gives each alone;
seeded samples draw as `generate(seed=...)`; stop strings, log-probabilities and penalties."""

from __future__ import annotations

import dataclasses
import threading
import time
import types

import pytest
import torch

from attnkit.generation import GenerationConfig, batching, generate
from attnkit.generation.batching import Scheduler
from attnkit.generation.rows import Failed, Finish, Piece, Sequence
from attnkit.generation.text import TextState
from attnkit.run import load_run
from tests.helpers import served_models, tiny_run

PROMPTS = ["a dog", "the cat sleeps", "zwei", "a", "ein hund läuft im park"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, types.SimpleNamespace]:
    tmp = tmp_path_factory.mktemp("runs")
    out = served_models(tmp)  # "window": a ring cache, which decodes in cohorts
    # location-aware attention carries each row's alignment beside the cache: cohorts too; its
    # location term (zero at the start) switched on, so that the alignment matters
    run = load_run(tiny_run(tmp / "location", "encoder-decoder", max_len=24,
                            attention_kind="location-aware", location_kernel=3))  # fmt: skip
    with torch.no_grad():
        weight = run.model.decoder.blocks[0].cross_attn.location_weight
        weight.normal_(0, 3, generator=torch.Generator().manual_seed(0))
    out["location"] = types.SimpleNamespace(model=run.model, tokenizer=run.tokenizer)
    return out


class Collected:
    """Each output's events, by output, as the scheduler sends them."""

    def __init__(self) -> None:
        self.events: dict[int, list] = {}
        self.lock = threading.Lock()

    def emit(self, key: int):
        def put(event: object) -> None:
            with self.lock:
                self.events.setdefault(key, []).append(event)

        return put

    def wait(self, n: int) -> None:
        deadline = time.monotonic() + 60
        while sum(isinstance(e[-1], Finish | Failed) for e in self.events.values()) < n:
            assert time.monotonic() < deadline, self.events
            time.sleep(0.01)

    def text(self, key: int) -> str:
        return "".join(e.text for e in self.events[key] if isinstance(e, Piece))


def _ids(served: types.SimpleNamespace, text: str) -> list[int]:
    return served.tokenizer.encode(text, add_eos=served.model.config.shape != "decoder")


def _alone(served: types.SimpleNamespace, ids: list[int], **options: object) -> list[int]:
    config = GenerationConfig(eos_token_id=served.model.config.eos_id, **options)
    return generate(served.model, torch.tensor([ids]), config=config).new_tokens()[0]


@pytest.mark.parametrize(
    ("shape", "max_tokens"),
    [("decoder", 30), ("encoder-decoder", 23), ("window", 30), ("location", 23)],
)
def test_outputs_joining_at_different_steps_are_as_alone(
    models: dict, shape: str, max_tokens: int
) -> None:
    """A max_batch of 3 for five outputs: two wait, then join as others leave; the decoder's
    30 new tokens after prompts of up to 22 outrun its max_len of 24 (the crop). A sliding
    window's model, and one with location-aware attention, decode in cohorts: the three
    admitted together, then the two that waited."""
    served, got = models[shape], Collected()
    scheduler = Scheduler(max_batch=3)
    sequences = [
        Sequence(served, _ids(served, prompt), GenerationConfig(max_new_tokens=max_tokens - i),
                 got.emit(i))  # each leaves at a step of its own
        for i, prompt in enumerate(PROMPTS)
    ]  # fmt: skip
    try:
        cohorts = shape in ("window", "location")
        if cohorts:  # a ring or alignments cannot take rows mid-way: cohorts of those that wait
            scheduler.add(sequences)
        for sequence in sequences if not cohorts else ():
            scheduler.add([sequence])
            time.sleep(0.01)
        got.wait(len(PROMPTS))
    finally:
        scheduler.shutdown()
    for i, prompt in enumerate(PROMPTS):
        expected = _alone(served, _ids(served, prompt), max_new_tokens=max_tokens - i)
        assert got.text(i) == served.tokenizer.decode(expected)
        finish = got.events[i][-1]
        assert (finish.completion_tokens, finish.reason) == (len(expected), "length")
    assert scheduler.steps < sum(max_tokens - i for i in range(len(PROMPTS)))  # shared steps


def test_a_seed_draws_as_generate_alone_whatever_the_batch(models: dict) -> None:
    served, got = models["decoder"], Collected()
    scheduler = Scheduler(max_batch=8)
    sampling = GenerationConfig(
        max_new_tokens=12, do_sample=True, temperature=0.9, top_p=0.9, seed=7
    )
    others = GenerationConfig(max_new_tokens=12, do_sample=True)
    try:
        scheduler.add(
            [Sequence(served, _ids(served, p), others, got.emit(i)) for i, p in enumerate(PROMPTS)]
            + [Sequence(served, _ids(served, "a dog"), sampling, got.emit(99))]
        )
        got.wait(len(PROMPTS) + 1)
    finally:
        scheduler.shutdown()
    expected = _alone(
        served, _ids(served, "a dog"), max_new_tokens=12, do_sample=True, temperature=0.9,
        top_p=0.9, seed=7,
    )  # fmt: skip
    assert got.text(99) == served.tokenizer.decode(expected)


def test_logprobs_are_the_models_and_penalties_change_the_choice(models: dict) -> None:
    served, got = models["decoder"], Collected()
    ids = _ids(served, "a dog")
    scheduler = Scheduler(max_batch=4)
    greedy = GenerationConfig(max_new_tokens=6, logprobs=3)
    banned = dict.fromkeys(range(served.model.config.vocab_size), -100.0)
    allowed = 5  # every token but one is biased away
    del banned[allowed]
    biased = GenerationConfig(
        max_new_tokens=6, do_sample=True, temperature=0.7, logit_bias=tuple(banned.items())
    )
    try:
        scheduler.add([Sequence(served, ids, greedy, got.emit(0))])
        scheduler.add([Sequence(served, ids, biased, got.emit(1))])
        got.wait(2)
    finally:
        scheduler.shutdown()
    tokens = [t for e in got.events[0] if isinstance(e, Piece) for t in e.tokens]
    first = tokens[0]
    with torch.no_grad():
        logits = served.model(torch.tensor([ids])).logits[0, -1]
    expected = torch.log_softmax(logits, -1)
    best = expected.topk(3)

    def text(ids: list[int]) -> str:  # a special token shows as its name
        return served.tokenizer.decode(ids) or served.tokenizer.id_to_token(ids[0])

    assert first.text == text([int(best.indices[0])]) and got.text(0).startswith(first.text)
    assert first.logprob == pytest.approx(float(best.values[0]), abs=1e-5)
    assert [t for t, _ in first.top] == [text([i]) for i in best.indices.tolist()]
    assert [lp for _, lp in first.top] == pytest.approx(best.values.tolist(), abs=1e-5)
    assert got.text(1) == served.tokenizer.decode([allowed] * 6)


def test_stop_strings_end_the_output_and_are_never_sent(models: dict) -> None:
    served = models["decoder"]
    full = served.tokenizer.decode(_alone(served, _ids(served, "a"), max_new_tokens=20))
    stop = full[5:8]
    got = Collected()
    scheduler = Scheduler(max_batch=2)
    try:
        sampling = GenerationConfig(max_new_tokens=20, stop_strings=(stop, "never there"))
        scheduler.add([Sequence(served, _ids(served, "a"), sampling, got.emit(0))])
        got.wait(1)
    finally:
        scheduler.shutdown()
    assert got.text(0) == full[: full.find(stop)]
    assert got.events[0][-1].reason == "stop"


def test_a_text_holds_back_what_could_begin_a_stop_string(models: dict) -> None:
    tokenizer = models["decoder"].tokenizer
    state = TextState(tokenizer, stop=("dog",))
    pieces = [state.add(tokenizer.token_to_id(c)) for c in "a do"]
    assert pieces == ["a", " ", "", ""]  # "do" might become "dog"
    assert state.add(tokenizer.token_to_id("t")) == "dot" and not state.stopped
    state = TextState(tokenizer, stop=("dog",))
    assert [state.add(tokenizer.token_to_id(c)) for c in "a dog"][-1] == "" and state.stopped
    assert state.text == "a "


def test_a_row_whose_choice_fails_mid_batch_fails_alone(models: dict) -> None:
    """Three rows decode together; after their first tokens one row's options turn into ones
    its choice cannot compute (a temperature of 1e-300 overflows its scores: no distribution
    to draw from). That row alone gets `Failed`; the other two end as `generate` alone."""
    served, got = models["decoder"], Collected()
    scheduler = Scheduler(max_batch=4)
    config = GenerationConfig(max_new_tokens=20, eos_token_id=())
    sequences = [
        Sequence(served, _ids(served, p), config, got.emit(i)) for i, p in enumerate(PROMPTS[:3])
    ]
    chosen = threading.Event()
    choose = batching.choose

    def poison(logits: torch.Tensor, rows: list) -> list:
        if len(sequences[1].output) >= 2:  # the batch is running: poison row 1 once
            bad = dataclasses.replace(config, do_sample=True, temperature=1e-300)
            sequences[1].row.config = bad
            chosen.set()
        return choose(logits, rows)

    batching.choose = poison
    try:
        scheduler.add(sequences)
        got.wait(3)
    finally:
        batching.choose = choose
        scheduler.shutdown()
    assert chosen.is_set()
    assert isinstance(got.events[1][-1], Failed)
    for i in (0, 2):
        ids = torch.tensor([_ids(served, PROMPTS[i])])
        alone = generate(served.model, ids, config=config).new_tokens()[0]
        assert got.text(i) == served.tokenizer.decode(alone)
        assert isinstance(got.events[i][-1], Finish)
