"""A real client: OpenAI's own Python package against attnkit serve on 127.0.0.1, for every
endpoint and every parameter of its completions and embeddings: each honoured (checked
against the library computing it alone) or refused with a 400 that names it."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
import torch

from attnkit.generation import GenerationConfig, generate
from attnkit.serve.app import create_app
from attnkit.serve.runs import Served
from attnkit.serve.settings import ServeSettings
from tests.serve.live import serving


@pytest.fixture(scope="module")
def client(served: list[Served]) -> Iterator[openai.OpenAI]:
    with serving(create_app(served, ServeSettings(api_key="k"))) as address:
        yield openai.OpenAI(base_url=address + "/v1", api_key="k", max_retries=0)


def _greedy(gpt: Served, ids: list[int], new: int, **options: object) -> str:
    config = GenerationConfig(max_new_tokens=new, eos_token_id=gpt.tokenizer.eos_id, **options)
    new_ids = generate(gpt.model, torch.tensor([ids]), config=config).new_tokens()[0]
    return gpt.tokenizer.decode(new_ids)


def test_models_list_and_retrieve(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["gpt", "bert", "mt"]
    assert client.models.retrieve("bert").id == "bert"
    with pytest.raises(openai.NotFoundError, match="no model 'llama'"):
        client.models.retrieve("llama")


def test_completions_plain_and_streamed(client: openai.OpenAI, served: list[Served]) -> None:
    gpt = served[0]
    done = client.completions.create(model="gpt", prompt="a dog", max_tokens=5, temperature=0)
    assert done.choices[0].text == _greedy(gpt, gpt.tokenizer.encode("a dog"), 5)
    chunks = list(
        client.completions.create(
            model="gpt", prompt="a dog", max_tokens=5, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices) == done.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage == done.usage  # usage, last
    assert all(c.usage is None for c in chunks[:-1])


def test_stop_strings_cut_plain_and_streamed_answers(
    client: openai.OpenAI, served: list[Served]
) -> None:
    gpt = served[0]
    full = _greedy(gpt, gpt.tokenizer.encode("a"), 20)
    stop = full[4:6]
    kept = full[: full.find(stop)]
    done = client.completions.create(
        model="gpt", prompt="a", max_tokens=20, temperature=0, stop=[stop, "\n"]
    )
    assert (done.choices[0].text, done.choices[0].finish_reason) == (kept, "stop")
    chunks = list(
        client.completions.create(
            model="gpt", prompt="a", max_tokens=20, temperature=0, stop=stop, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == kept
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_logprobs_and_echo(client: openai.OpenAI, served: list[Served]) -> None:
    gpt = served[0]
    ids = gpt.tokenizer.encode("a dog")
    done = client.completions.create(
        model="gpt", prompt="a dog", max_tokens=4, temperature=0, logprobs=2, echo=True
    )
    choice = choice_text = done.choices[0]
    choice_text = choice.text
    lp = choice.logprobs
    assert choice_text.startswith("a dog") and "".join(lp.tokens) == choice_text
    assert lp.token_logprobs[0] is None and len(lp.tokens) == len(ids) + 4
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    with torch.no_grad():
        logits = gpt.model(torch.tensor([ids])).logits[0].log_softmax(-1)
    assert lp.token_logprobs[1] == pytest.approx(float(logits[0, ids[1]]), abs=1e-4)
    assert lp.token_logprobs[len(ids)] == pytest.approx(float(logits[-1].max()), abs=1e-4)
    assert all(len(top) <= 2 for top in lp.top_logprobs[1:])
    scored = client.completions.create(model="gpt", prompt="a dog", max_tokens=0, echo=True,
                                       logprobs=0)  # fmt: skip
    assert scored.choices[0].text == "a dog" and scored.usage.completion_tokens == 0


def test_penalties_bias_top_k_and_repetition_penalty_change_the_choice(
    client: openai.OpenAI, served: list[Served]
) -> None:
    gpt = served[0]
    ids = gpt.tokenizer.encode("a dog")
    plain = _greedy(gpt, ids, 12)
    assert len(set(plain)) < len(plain)  # this tiny model repeats itself: penalties bite

    def greedy(**options: object) -> str:
        return (
            client.completions.create(
                model="gpt", prompt="a dog", max_tokens=12, temperature=0, **options
            )
            .choices[0]
            .text
        )

    assert greedy(frequency_penalty=2.0) != plain
    # presence: every token already in the output loses 1.5 once, whatever its count
    two = client.completions.create(model="gpt", prompt="a dog", max_tokens=3, temperature=0,
                                    presence_penalty=1.5, logprobs=0).choices[0]  # fmt: skip
    first, second = (gpt.tokenizer.token_to_id(c) for c in two.text[:2])
    with torch.no_grad():
        z = gpt.model(torch.tensor([[*ids, first, second]])).logits[0, -1]
    z[[first, second]] -= 1.5
    third = gpt.tokenizer.token_to_id(two.text[2])
    expected = float(z.log_softmax(-1)[third])
    assert two.logprobs.token_logprobs[2] == pytest.approx(expected, abs=1e-4)
    penalised = greedy(extra_body={"repetition_penalty": 3.0})
    assert penalised == _greedy(gpt, ids, 12, repetition_penalty=3.0)
    forced = gpt.tokenizer.token_to_id("z")
    assert greedy(logit_bias={str(forced): 100}) == "z" * 12
    top1 = (
        client.completions.create(
            model="gpt", prompt="a dog", max_tokens=12, temperature=1.5, extra_body={"top_k": 1}
        )
        .choices[0]
        .text
    )
    assert top1 == plain  # one token left to sample from: the greedy one


def test_seed_n_best_of_and_token_prompts(client: openai.OpenAI, served: list[Served]) -> None:
    gpt = served[0]
    ids = gpt.tokenizer.encode("a dog")

    def sampled(seed: int, **options: object):
        return client.completions.create(
            model="gpt", prompt="a dog", max_tokens=10, temperature=1.0, seed=seed, **options
        )

    assert sampled(3).choices[0].text == sampled(3).choices[0].text
    assert sampled(3).choices[0].text == _greedy(gpt, ids, 10, do_sample=True, seed=3)
    assert sampled(3).choices[0].text != sampled(4).choices[0].text
    copies = client.completions.create(model="gpt", prompt="a dog", max_tokens=6, n=3,
                                       temperature=0)  # fmt: skip
    assert len({c.text for c in copies.choices}) == 1 and len(copies.choices) == 3
    streamed = list(client.completions.create(model="gpt", prompt=["a", "zwei"], max_tokens=4,
                                              n=2, stream=True))  # fmt: skip
    assert {c.choices[0].index for c in streamed} == {0, 1, 2, 3}
    best = client.completions.create(model="gpt", prompt="a dog", max_tokens=6, n=2, best_of=4,
                                     logprobs=0, seed=1)  # fmt: skip
    assert [c.index for c in best.choices] == [0, 1]
    means = [sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs) for c in best.choices]
    assert means[0] >= means[1]
    by_ids = client.completions.create(model="gpt", prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == _greedy(gpt, ids, 6)
    unbounded = client.completions.create(model="gpt", prompt="a", max_tokens=None, temperature=0)
    assert unbounded.usage.completion_tokens > 16  # null: as many as the server allows


def test_embeddings_float_and_base64(client: openai.OpenAI, served: list[Served]) -> None:
    bert = served[1]
    expected = bert.encoder.encode(["a dog", "the cat"])
    # the client asks for base64 on the wire when not told otherwise
    packed = client.embeddings.create(model="bert", input=["a dog", "the cat"])
    floats = client.embeddings.create(model="bert", input=["a dog", "the cat"],
                                      encoding_format="float")  # fmt: skip
    for answer in (packed, floats):
        got = torch.tensor([d.embedding for d in answer.data])
        assert torch.allclose(got, expected, atol=1e-6)
    same = client.embeddings.create(model="bert", input="a dog", dimensions=16)
    assert len(same.data[0].embedding) == 16


@pytest.mark.parametrize(
    ("call", "param", "status"),
    [
        (dict(prompt="x", suffix="y"), "suffix", 400),
        (dict(prompt="x", extra_body={"foo": 1}), "foo", 400),
        (dict(prompt="x", temperature=3), "temperature", 400),
        (dict(prompt="x", n=99), "n", 400),
        (dict(prompt="x", seed=2**70), "seed", 400),
        (dict(prompt="x", stop=["a", "b", "c", "d", "e"]), "stop", 400),
        (dict(prompt="x", logit_bias={"abc": 1}), "logit_bias", 400),
        (dict(prompt="x", logit_bias={"99999": 1}), "logit_bias", 400),
        (dict(prompt="x", best_of=1, n=2), "best_of", 400),
        (dict(prompt="x", best_of=2, n=1, stream=True), "best_of", 400),
        (dict(prompt="x", max_tokens=0), "max_tokens", 400),
        (dict(prompt="x", max_tokens=9999), "max_tokens", 400),
        (dict(prompt="x" * 60), "prompt", 400),
        (dict(prompt=[]), "prompt", 400),
        (dict(prompt=[[1, 2], [99999]]), "prompt", 400),
        (dict(prompt="x", stream_options={"include_usage": True}), "stream_options", 400),
        (dict(prompt="x", model="bert"), "model", 400),
        (dict(prompt="x", model="nope"), "model", 404),
    ],
)
def test_a_refusal_names_its_parameter(
    client: openai.OpenAI, call: dict, param: str, status: int
) -> None:
    call = {"model": "gpt", **call}
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(**call)
    error = caught.value
    assert error.status_code == status and error.param == param
    assert isinstance(error.code, str) and error.type and error.message


def test_embedding_refusals_name_their_parameter(client: openai.OpenAI) -> None:
    for call, param in (
        (dict(input="a", dimensions=8), "dimensions"),
        (dict(input=["a", " "]), "input"),
        (dict(input="a" * 60), "input"),
        (dict(input="a", model="gpt"), "model"),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            client.embeddings.create(**{"model": "bert", **call})
        assert caught.value.param == param


def test_a_key_is_needed(client: openai.OpenAI) -> None:
    wrong = openai.OpenAI(base_url=str(client.base_url), api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        wrong.models.list()
    assert caught.value.code == "invalid_api_key"
