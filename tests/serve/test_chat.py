"""Chat completions with OpenAI's client against a live server: the prompt is the model's chat
template (its tokenizer folder's, or the documented default) rendered in Jinja's sandbox, the
answer is the greedy continuation of that prompt, and what chat cannot do is refused by name."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
import torch

from attnkit.generation import GenerationConfig, generate
from attnkit.run import RunFolder
from attnkit.serve.app import create_app
from attnkit.serve.chat import ChatTemplate
from attnkit.serve.errors import ServeError
from attnkit.serve.runs import Served, served_runs
from tests.helpers import tiny_run
from tests.serve.live import serving

# A template in the style of Hugging Face's (Zephyr's): roles as tags, the end token after each.
TAGGED = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and not loop.first %}{{ raise_exception('system first') }}"
    "{% endif %}<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)
MESSAGES = [{"role": "system", "content": "hi"}, {"role": "user", "content": "a dog"}]


@pytest.fixture(scope="module")
def chat_models(
    tmp_path_factory: pytest.TempPathFactory, served: list[Served]
) -> Iterator[tuple[openai.OpenAI, list[Served]]]:
    tagged = tiny_run(tmp_path_factory.mktemp("tagged") / "tagged", "decoder", max_len=64)
    config = {"chat_template": TAGGED, "model_max_length": 40}
    RunFolder(tagged).tokenizer_config.write_text(json.dumps(config))
    models = [*served, *served_runs([str(tagged)])]
    with serving(create_app(models)) as address:
        yield openai.OpenAI(base_url=address + "/v1", api_key="none", max_retries=0), models


def _greedy(served: Served, prompt: str, new: int) -> str:
    config = GenerationConfig(max_new_tokens=new, eos_token_id=served.tokenizer.eos_id)
    ids = torch.tensor([served.tokenizer.encode(prompt)])
    return served.tokenizer.decode(generate(served.model, ids, config=config).new_tokens()[0])


def test_the_default_template_is_a_play_script() -> None:
    prompt = ChatTemplate(None).render([*MESSAGES, {"role": "assistant", "content": "ok"},
                                        {"role": "developer", "content": "more"}])  # fmt: skip
    assert prompt == (
        "SYSTEM:\nhi\n\nUSER:\na dog\n\nASSISTANT:\nok\n\nSYSTEM:\nmore\n\nASSISTANT:\n"
    )


def test_a_tokenizer_folders_template_is_rendered_with_its_tokens() -> None:
    prompt = ChatTemplate(TAGGED, "<s>", "</s>").render(MESSAGES)
    assert prompt == "<system>hi</s><user>a dog</s><assistant>"


def test_the_sandbox_keeps_templates_and_messages_from_python() -> None:
    escape = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ServeError, match="unsafe") as caught:
        escape.render(MESSAGES)
    assert caught.value.status == 400
    mutate = ChatTemplate("{% set _ = messages.append(1) %}{{ messages | length }}")
    with pytest.raises(ServeError):
        mutate.render(MESSAGES)
    # a message is data, never template code
    literal = ChatTemplate(None).render([{"role": "user", "content": "{{ 7 * 7 }}"}])
    assert "{{ 7 * 7 }}" in literal and "49" not in literal


def test_a_chat_is_the_greedy_answer_to_its_rendered_prompt(chat_models: tuple) -> None:
    client, models = chat_models
    tagged = models[-1]
    done = client.chat.completions.create(
        model="tagged", messages=MESSAGES, max_completion_tokens=6, temperature=0
    )
    prompt = "<system>hi</s><user>a dog</s><assistant>"
    assert done.choices[0].message.content == _greedy(tagged, prompt, 6)
    assert done.choices[0].message.role == "assistant" and done.object == "chat.completion"
    assert done.usage.prompt_tokens == len(tagged.tokenizer.encode(prompt))
    gpt = models[0]
    default = client.chat.completions.create(
        model="gpt", messages=MESSAGES, max_tokens=6, temperature=0
    )
    script = "SYSTEM:\nhi\n\nUSER:\na dog\n\nASSISTANT:\n"
    assert default.choices[0].message.content == _greedy(gpt, script, 6)


def test_a_streamed_chat_opens_with_the_role_and_ends_with_usage(chat_models: tuple) -> None:
    client, _ = chat_models
    whole = client.chat.completions.create(
        model="gpt", messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True,
        top_logprobs=2,
    )  # fmt: skip
    chunks = list(
        client.chat.completions.create(
            model="gpt", messages=MESSAGES, max_tokens=6, temperature=0, stream=True, n=2,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert mine[0].delta.role == "assistant"
        assert "".join(c.delta.content or "" for c in mine) == whole.choices[0].message.content
        assert mine[-1].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == 2 * whole.usage.completion_tokens
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.logprob - 1e-6
               for t in content)  # fmt: skip


def test_a_template_that_refuses_the_messages_is_a_400(chat_models: tuple) -> None:
    client, _ = chat_models
    with pytest.raises(openai.BadRequestError, match="system first") as caught:
        client.chat.completions.create(model="tagged", messages=[*MESSAGES, MESSAGES[0]])
    assert caught.value.param == "messages"


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (dict(model="bert"), "model"),
        (dict(model="mt"), "model"),
        (dict(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
        (dict(tool_choice="required"), "tool_choice"),
        (dict(response_format={"type": "json_object"}), "response_format"),
        (dict(modalities=["text", "audio"]), "modalities"),
        (dict(reasoning_effort="low"), "reasoning_effort"),
        (dict(store=True), "store"),
        (dict(service_tier="flex"), "service_tier"),
        (dict(top_logprobs=2), "top_logprobs"),
        (dict(max_completion_tokens=0), "max_completion_tokens"),
        (dict(messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]),
         "messages.0.content.0"),
    ],
)  # fmt: skip
def test_what_chat_cannot_do_is_refused_by_name(chat_models: tuple, call: dict, param: str) -> None:
    client, _ = chat_models
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(**{"model": "gpt", "messages": MESSAGES, **call})
    assert caught.value.param == param
