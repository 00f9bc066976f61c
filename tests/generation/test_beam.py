"""Beam search: one beam is greedy, wide beams find the exhaustive optimum, n-best lists."""

import itertools
import threading
import time

import pytest
import torch

from attnkit.data.batch import pad
from attnkit.errors import AttnkitError
from attnkit.generation import beam_search, generate, static_cache
from attnkit.generation.batching import Scheduler
from attnkit.generation.beam import BeamSearch, sliced
from attnkit.generation.config import GenerationConfig
from attnkit.generation.rows import Sequence
from attnkit.run import load_run
from tests.helpers import peaked, source_batch, tiny_model, tiny_run


@pytest.mark.parametrize("shape", ["encoder-decoder", "decoder"])
def test_beam_search_with_one_beam_is_greedy(shape):
    model = peaked(shape)
    ids, mask = source_batch()
    greedy = generate(model, ids, mask, max_new_tokens=10)
    beam = beam_search(model, ids, mask, max_new_tokens=10, num_beams=1)
    assert beam.new_tokens() == greedy.new_tokens()
    assert any(len(t) < 10 for t in greedy.new_tokens())  # EOS was reached somewhere


@torch.no_grad()
def test_beam_search_finds_the_best_sequence_when_beams_cover_every_prefix():
    """Vocabulary 5, 3 new tokens: all 85 sequences are scored by teacher forcing.

    On this model and these sources two beams miss the best sequence at every
    length penalty tried, so the test tells an exhaustive search from a narrow one.
    """
    eos, steps = 2, 3
    model = tiny_model(
        seed=2,
        layers=2,
        vocab_size=5,
        d_model=64,
        n_heads=4,
        d_ff=128,
        max_len=16,
        dropout=0.0,
        embedding_dropout=0.0,
        tie_embeddings="none",
        norm_position="pre",
        eos_id=eos,
        decoder_start_id=1,
    ).eval()
    with torch.no_grad():
        model.head.weight.mul_(2.0)
    src = torch.tensor([[3, 4, 3, 1], [4, 4, 1, 3], [1, 3, 4, 0]])
    others = [t for t in range(5) if t != eos]
    candidates = [
        [*prefix, eos] for n in range(steps) for prefix in itertools.product(others, repeat=n)
    ] + [list(p) for p in itertools.product(others, repeat=steps)]
    tgt, tgt_mask = pad([[1, *seq] for seq in candidates], 0)
    lengths = torch.tensor([len(seq) for seq in candidates])
    for row in range(src.shape[0]):
        sources = src[row : row + 1].expand(len(candidates), -1)
        log_probs = model(sources, tgt[:, :-1], tgt_mask=tgt_mask[:, :-1]).logits.log_softmax(-1)
        token_log_probs = log_probs.gather(2, tgt[:, 1:, None])[..., 0] * tgt_mask[:, 1:]
        totals = token_log_probs.sum(1)
        for length_penalty in (0.0, 1.0, 2.0):
            out = generate(
                model,
                src[row : row + 1],
                max_new_tokens=steps,
                num_beams=80,
                length_penalty=length_penalty,
                early_stopping="never",
            )
            scores = totals / lengths.double() ** length_penalty
            best = int(scores.argmax())
            assert out.sequences[0, 1 : 1 + lengths[best]].tolist() == candidates[best]
            assert out.sequences_scores[0].item() == pytest.approx(scores[best].item(), abs=1e-5)


@pytest.mark.parametrize("shape", ["encoder-decoder", "decoder"])
def test_cached_and_uncached_beam_search_agree(shape):
    model = peaked(shape)
    ids, mask = source_batch()
    options = {"max_new_tokens": 9, "num_beams": 3, "num_return_sequences": 2}
    cached = generate(model, ids, mask, **options)
    uncached = generate(model, ids, mask, use_cache=False, **options)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores)


def test_n_best_lists_are_sorted_and_distinct():
    model = peaked("encoder-decoder")
    ids, mask = source_batch()
    out = generate(model, ids, mask, max_new_tokens=8, num_beams=4, num_return_sequences=3)
    scores = out.sequences_scores.view(4, 3)
    assert torch.all(scores[:, :-1] >= scores[:, 1:])
    tokens = out.new_tokens()
    for i in range(4):
        group = [tuple(t) for t in tokens[3 * i : 3 * i + 3]]
        assert len(set(group)) == 3


@pytest.mark.parametrize("shape", ["encoder-decoder", "decoder"])
@pytest.mark.parametrize(
    "options",
    [
        {"num_beams": 4, "num_return_sequences": 2},
        {"num_beams": 3, "repetition_penalty": 1.3, "early_stopping": True},
        {"num_beams": 2, "length_penalty": 0.5, "early_stopping": "never"},
    ],
)
def test_a_beam_search_run_in_slices_finds_what_one_run_whole_does(shape, options):
    """Sentences that end at different steps leave mid-way; slicing only decides when steps run."""
    model = peaked(shape)
    ids, mask = source_batch()
    whole = generate(model, ids, mask, max_new_tokens=12, **options)
    for steps in (1, 2, 3, 50):
        search = BeamSearch(model, ids, mask, max_new_tokens=12, **options)
        slices = 1
        while not search.advance(steps):
            slices += 1
        out = search.result()
        assert torch.equal(out.sequences, whole.sequences)
        assert torch.equal(out.sequences_scores, whole.sequences_scores)
        assert slices == -(-search.step // steps)  # each slice ran its steps, the last its rest
        assert search.state is None  # an ended search has given its cache back
    assert any(len(t) < 12 for t in whole.new_tokens())  # sentences did end early


def test_a_beam_search_not_ended_has_no_result_and_closes_early():
    model = peaked("decoder")
    ids, mask = source_batch()
    search = BeamSearch(model, ids, mask, max_new_tokens=12, num_beams=3)
    assert not search.advance(1)
    with pytest.raises(AttnkitError, match="has run 1 steps and not ended"):
        search.result()
    search.close()
    assert search.state is None
    with pytest.raises(AttnkitError, match="steps must be a positive integer"):
        search.advance(0)
    with pytest.raises(AttnkitError, match="closed before its end"):
        search.advance(1)


def test_a_sliced_beam_search_lets_the_engine_decode_between_its_slices(monkeypatch, tmp_path):
    """On the batching engine's thread, a greedy row beside the search takes a decoding step
    between every two of its slices (one step each), counted, not timed; the search finds what
    it finds run whole."""
    lm, mt = load_run(tiny_run(tmp_path / "lm", "decoder")), peaked("encoder-decoder")
    scheduler = Scheduler(max_batch=4)
    steps: list[int] = []
    original = mt.decode_step

    def counted(*args, **kwargs):
        steps.append(scheduler.steps)
        return original(*args, **kwargs)

    ids, mask = source_batch()
    options = {"max_new_tokens": 12, "num_beams": 3, "num_return_sequences": 2}
    whole = generate(mt, ids, mask, **options)
    monkeypatch.setattr(mt, "decode_step", counted)
    # a row that outlasts the search: its end token ruled out, many more tokens than steps
    end = lm.model.config.eos_id
    endless = GenerationConfig(max_new_tokens=10_000, logit_bias={end: -100.0})
    row = Sequence(lm, lm.tokenizer.encode("a dog"), endless, lambda event: None)
    try:
        scheduler.add([row])
        deadline = time.monotonic() + 60
        while scheduler.steps < 2:  # the row decodes
            assert time.monotonic() < deadline
            time.sleep(0.001)
        out = sliced(scheduler, lambda: BeamSearch(mt, ids, mask, **options), 1).result(60)
    finally:
        row.cancelled = True
        scheduler.shutdown()
    assert torch.equal(out.sequences, whole.sequences)
    assert torch.equal(out.sequences_scores, whole.sequences_scores)
    assert len(steps) > 5 and all(b > a for a, b in itertools.pairwise(steps))


def test_a_cancelled_sliced_beam_search_stops_and_a_failing_one_says_why():
    mt = peaked("encoder-decoder")
    ids, mask = source_batch()
    scheduler = Scheduler(max_batch=4)
    made: list[BeamSearch] = []

    def search() -> BeamSearch:
        made.append(BeamSearch(mt, ids, mask, max_new_tokens=12, num_beams=3))
        return made[-1]

    try:
        job = sliced(scheduler, search, 1)
        assert job.cancel()
        deadline = time.monotonic() + 60
        while any(search.state is not None for search in made):  # its next slice closes it
            assert time.monotonic() < deadline
            time.sleep(0.01)
        failing = sliced(scheduler, lambda: BeamSearch(mt, ids[:, :0], num_beams=2), 1)
        with pytest.raises(AttnkitError, match="non-empty"):
            failing.result(60)
    finally:
        scheduler.shutdown()
    assert len(made) <= 1 and not any(search.done for search in made)  # stopped before its end


def test_a_sliced_beam_search_whose_engine_closes_is_cancelled_and_closed():
    """The engine closing drops the search's queued slice: its caller hears it (the Future is
    cancelled rather than never done) and the search gives its cache back."""
    mt = peaked("encoder-decoder")
    ids, mask = source_batch()
    scheduler = Scheduler(max_batch=4)
    made: list[BeamSearch] = []
    gate, busy = threading.Event(), threading.Event()

    def search() -> BeamSearch:
        made.append(BeamSearch(mt, ids, mask, max_new_tokens=12, num_beams=3))
        return made[-1]

    def blocker() -> None:  # queued behind the prefix: the search's next slice queues after it
        busy.set()
        gate.wait(60)

    job = sliced(scheduler, search, 1)
    scheduler.submit(blocker)
    assert busy.wait(60)
    scheduler.shutdown(wait=False)  # closes while the next slice waits in the queue
    gate.set()
    scheduler.thread.join(60)
    assert job.cancelled()
    assert len(made) == 1 and made[0].state is None  # closed, its cache given back


@pytest.mark.parametrize("shape", ["encoder-decoder", "decoder"])
def test_static_cache_searches_taking_turns_a_step_at_a_time_each_find_their_own(
    shape, monkeypatch
):
    """Two searches on static caches of one shape, resumed in turns as the server's slices
    are: each holds buffers of its own and finds what it finds run whole."""
    monkeypatch.setattr(static_cache, "_compiled", lambda kind: kind.decode_step)  # no compile
    monkeypatch.setattr(static_cache, "REUSED_ON", frozenset({"cpu", "cuda"}))
    static_cache.release_all()
    model = peaked(shape)
    ids, mask = source_batch()
    other = ids.flip(0), mask.flip(0)
    options = {"num_beams": 3, "max_new_tokens": 10, "cache_implementation": "static"}
    try:
        wholes = [generate(model, *inputs, **options) for inputs in ((ids, mask), other)]
        searches = [BeamSearch(model, *inputs, **options) for inputs in ((ids, mask), other)]
        assert all(s.state.static for s in searches)
        while not all(s.done for s in searches):
            for search in searches:
                search.advance(1)
    finally:
        static_cache.release_all()
    for search, whole in zip(searches, wholes, strict=True):
        assert torch.equal(search.result().sequences, whole.sequences)
        assert torch.equal(search.result().sequences_scores, whole.sequences_scores)
