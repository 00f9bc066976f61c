"""`LLM`: many prompts, each with its own options, decoded together on the batching engine,
give what `generate` gives each alone (greedy, penalties, beams), streamed or whole; a row
whose token choice fails is failed alone while the others of its batch go on."""

from __future__ import annotations

import itertools
import time

import pytest
import torch

import attnkit
from attnkit.errors import AttnkitError
from attnkit.generation import LLM, GenerationConfig, engine, generate
from attnkit.generation.beam import BeamSearch
from attnkit.generation.config import resolve
from attnkit.inference import translate_run
from attnkit.run import load_run
from tests.helpers import tiny_run

PROMPTS = ["a dog", "the cat sleeps", "zwei", "ein hund läuft im park"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("engine")
    return {
        shape: load_run(tiny_run(tmp / shape, shape, max_len=24))
        for shape in ("decoder", "encoder-decoder")
    }


def _alone(run, prompt: str, config: GenerationConfig) -> list[int]:
    ids = run.tokenizer.encode(prompt)
    config = resolve(config, {}, run.model.config, run.tokenizer)
    return generate(run.model, torch.tensor([ids]), config=config).new_tokens()[0]


def test_prompts_with_options_of_their_own_decode_as_generate_alone(runs: dict) -> None:
    """Greedy rows beside rows with a repetition, presence or frequency penalty or a bias:
    one token chooser, the processors `generate` runs."""
    run = runs["decoder"]
    configs = [
        GenerationConfig(max_new_tokens=12),
        GenerationConfig(max_new_tokens=9, repetition_penalty=1.5),
        GenerationConfig(max_new_tokens=15, presence_penalty=1.0, frequency_penalty=0.5),
        GenerationConfig(max_new_tokens=7, logit_bias={5: 3.0, 6: -2.0}),
    ]
    with LLM(run, max_batch=3) as llm:  # three decode at once: the fourth joins later
        done = llm.generate(PROMPTS, configs)
    for prompt, config, out in zip(PROMPTS, configs, done, strict=True):
        expected = _alone(run, prompt, config)
        assert out.token_ids == expected
        assert out.text == run.tokenizer.decode(expected)
        assert out.prompt == prompt and out.prompt_tokens == len(run.tokenizer.encode(prompt))
        assert out.finish_reason == ("length" if len(expected) == config.max_new_tokens else "stop")


def test_a_stream_is_the_whole_text_in_pieces_and_a_seed_draws_as_generate(runs: dict) -> None:
    run = runs["decoder"]
    sampled = GenerationConfig(max_new_tokens=12, do_sample=True, top_k=8, seed=3)
    with attnkit.LLM(run) as llm:
        pieces = list(llm.stream("a dog", sampled))
        (whole,) = llm.generate("a dog", sampled)
    assert "".join(pieces) == whole.text == run.tokenizer.decode(_alone(run, "a dog", sampled))
    assert len(pieces) > 1


def test_translations_greedy_and_beam_are_translate_runs(runs: dict) -> None:
    run = runs["encoder-decoder"]
    texts = ["ein hund", "", "zwei katzen schlafen"]
    beam = GenerationConfig(num_beams=3, max_new_tokens=10)
    with LLM(run) as llm:
        greedy = [c.text for c in llm.generate(texts, max_new_tokens=10)]
        beams = [c.text for c in llm.generate(texts, beam)]
    assert greedy == translate_run(run, texts, GenerationConfig(max_new_tokens=10))
    assert beams == translate_run(run, texts, beam)


def test_a_failing_row_fails_alone_and_the_running_batch_goes_on(runs: dict) -> None:
    """A row whose temperature overflows the scores (1e-300: inf, then no distribution to
    draw from) joins two rows already decoding: it alone raises, they end as if alone."""
    run = runs["decoder"]
    good = GenerationConfig(max_new_tokens=20, eos_token_id=())
    bad = GenerationConfig(max_new_tokens=20, do_sample=True, temperature=1e-300)
    with LLM(run) as llm:
        first, second = llm.submit("a dog", good), llm.submit("zwei", good)
        stream = iter(first)  # kept: a stream dropped unfinished cancels its request
        assert next(stream)  # the batch is running
        failing = llm.submit("the cat", bad)
        with pytest.raises(AttnkitError, match="decoding 'the cat' failed"):
            failing.result(timeout=60)
        with pytest.raises(AttnkitError):  # it says so again, not hangs
            failing.result(timeout=60)
        assert first.result(timeout=60).token_ids == _alone(run, "a dog", good)
        assert list(stream) == []  # the rest was read by result()
        assert second.result(timeout=60).token_ids == _alone(run, "zwei", good)
        assert llm.generate("a", good)[0].token_ids == _alone(run, "a", good)  # still serving


def test_what_an_llm_refuses_in_one_sentence(runs: dict) -> None:
    with LLM(runs["decoder"]) as llm:
        with pytest.raises(AttnkitError, match="one output a prompt"):
            llm.submit("a", num_return_sequences=2, do_sample=True)
        with pytest.raises(AttnkitError, match="stop_strings and logprobs"):
            llm.submit("a", num_beams=2, logprobs=1)
        with pytest.raises(AttnkitError, match="2 configs for 1 prompts"):
            llm.generate(["a"], [GenerationConfig(), GenerationConfig()])
        with pytest.raises(AttnkitError, match="option"):
            llm.submit("a", max_tokens=3)  # OpenAI's name: GenerationConfig's is max_new_tokens
    with pytest.raises(AttnkitError, match="closed"):
        llm.submit("a")
    with pytest.raises(AttnkitError, match="generate returns ids"):
        run = runs["decoder"]
        generate(run.model, torch.tensor([[5, 6]]), stop_strings=("x",))


def test_a_translations_processors_read_its_output_not_its_source(runs: dict) -> None:
    """A repetition penalty and n-gram blocking over the decoder's start token and output,
    as `generate` applies them, so the rows translate as `translate_run` does."""
    run = runs["encoder-decoder"]
    texts = ["ein hund läuft im park", "zwei katzen"]
    config = GenerationConfig(max_new_tokens=12, repetition_penalty=1.8, no_repeat_ngram_size=2)
    with LLM(run) as llm:
        done = [c.text for c in llm.generate(texts, config)]
    assert done == translate_run(run, texts, config)


def test_logprobs_past_the_vocabulary_report_the_whole_vocabulary(runs: dict) -> None:
    run = runs["decoder"]
    with LLM(run) as llm:
        out = llm.generate("a dog", max_new_tokens=3, logprobs=10_000)[0]
    assert len(out.logprobs) == 3
    assert all(len(t.top) == run.model.config.vocab_size for t in out.logprobs)


def test_logprobs_of_a_prompt_that_decodes_as_a_job_are_refused(runs: dict) -> None:
    """`use_cache=False` decodes as a job of `generate`, which chooses ids without reporting
    their log-probabilities: asked, the LLM says so."""
    refused = pytest.raises(AttnkitError, match="logprobs come from the batching engine's rows")
    with LLM(runs["decoder"]) as llm, refused:
        llm.submit("a", logprobs=1, use_cache=False)


def test_a_beam_searchs_n_best_come_with_their_scores(runs: dict) -> None:
    run = runs["encoder-decoder"]
    beam = GenerationConfig(num_beams=3, num_return_sequences=2, max_new_tokens=8)
    with LLM(run) as llm:
        (out,) = llm.generate(["ein hund"], beam)
    config = resolve(beam, {}, run.model.config, run.tokenizer)
    ids = torch.tensor([run.tokenizer.encode("ein hund", add_eos=True)])
    whole = generate(run.model, ids, config=config)
    assert [text for text, _ in out.n_best] == run.tokenizer.decode_batch(whole.new_tokens())
    assert [score for _, score in out.n_best] == whole.sequences_scores.tolist()
    assert out.text == out.n_best[0][0] and out.token_ids == whole.new_tokens()[0]


def test_a_result_read_whole_is_decoded_once_and_reads_as_the_stream(
    runs: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`submit_ids(..., streamed=False)` (the command line's, `inference.translate`'s): the
    text of each output decoded once at its end, not at every token, the same text."""
    run = runs["decoder"]
    config = GenerationConfig(max_new_tokens=12, eos_token_id=())
    ids = [run.tokenizer.encode(p) for p in PROMPTS[:2]]
    with LLM(run) as llm:
        streamed = [r.result().text for r in llm.submit_ids(ids, [config] * 2)]
        calls = []
        decode = type(run.tokenizer).decode_continuation
        monkeypatch.setattr(
            type(run.tokenizer),
            "decode_continuation",
            lambda self, *a: calls.append(1) or decode(self, *a),
        )
        whole = [r.result().text for r in llm.submit_ids(ids, [config] * 2, streamed=False)]
    assert whole == streamed and all(streamed)
    assert len(calls) == 2  # one an output, not one a token


def test_an_llms_beam_search_runs_in_slices_between_the_rows_steps(runs: dict, monkeypatch):
    """A beam search submitted beside a running row goes a slice at a time (one step a slice
    here): the row takes a step between every two slices (counted, not timed), and the
    search's n best are what `generate` finds alone."""
    run = runs["decoder"]
    monkeypatch.setattr(engine, "BEAM_STEPS", 1)
    llm = LLM.of(run.model, run.tokenizer)
    slices: list[int] = []
    advance = BeamSearch.advance

    def counted(search: BeamSearch, n: int) -> bool:
        slices.append(llm.scheduler.steps)
        return advance(search, n)

    monkeypatch.setattr(BeamSearch, "advance", counted)
    end = run.model.config.eos_id
    endless = llm.submit("a dog", max_new_tokens=10_000, logit_bias={end: -100.0})
    beam = GenerationConfig(max_new_tokens=10, num_beams=3, min_new_tokens=10)
    try:
        deadline = time.monotonic() + 60
        while llm.scheduler.steps < 2:  # the row decodes
            assert time.monotonic() < deadline
            time.sleep(0.001)
        got = llm.generate(["the cat"], beam)[0]
    finally:
        endless.cancel()
        llm.close()
    assert got.token_ids == _alone(run, "the cat", beam)
    assert len(slices) >= 9 and all(b > a for a, b in itertools.pairwise(slices))


def test_ids_given_with_several_sampled_outputs_are_refused_as_prompts_are(runs: dict) -> None:
    """Through `submit_ids` too (`inference.complete` calls it): one output a prompt, else its
    rows would hand each request another request's samples."""
    run = runs["decoder"]
    config = GenerationConfig(do_sample=True, num_return_sequences=2, max_new_tokens=3)
    ids = [run.tokenizer.encode(p) for p in PROMPTS[:2]]
    with LLM(run) as llm, pytest.raises(AttnkitError, match="one output a prompt"):
        llm.submit_ids(ids, [config, config])
