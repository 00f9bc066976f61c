"""Chat templates: a conversation rendered into the one prompt a decoder continues.

A model's template is the Jinja text its tokenizer folder brings
(`tokenizer_config.json`'s `chat_template`, kept by `attnkit import hf`), as
Hugging Face's `apply_chat_template` renders it: the messages, `bos_token`,
`eos_token` and `add_generation_prompt` (true), with `raise_exception`,
`strftime_now` and a `tojson` that does not escape HTML. A run with no template
gets `DEFAULT_TEMPLATE`, the play-script layout of Tiny Shakespeare:

    SYSTEM:
    Answer briefly.

    USER:
    Who is there?

    ASSISTANT:

Templates run in Jinja's immutable sandbox: a template (or a message crafted
to look like template code, which is only ever data here) cannot reach Python's
objects, files or modules, nor change the values it is given; one that would read
another template (`{% include %}`, `{% import %}`, `{% extends %}`) is refused when
it is compiled, at the server's start. A conversation the
template refuses (`raise_exception`) is a 400 with the template's own words.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from attnkit.errors import AttnkitError
from attnkit.run import RunFolder
from attnkit.serve.errors import ServeError

# the tags that read another template: a served template is one text, reading no file
_OUTSIDE = (nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)

DEFAULT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] | upper }}:\n{{ message['content'] }}\n\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:\n{% endif %}"
)


def read_template(folder: RunFolder) -> str | None:
    """The chat template of a run's tokenizer_config.json (its `default` one if it names
    several), or None when the run has none."""
    path = folder.tokenizer_config
    if not path.is_file():
        return None
    try:
        template = json.loads(path.read_text()).get("chat_template")
    except (json.JSONDecodeError, AttributeError) as err:
        raise AttnkitError(f"{path} is not a JSON object ({err}); fix or remove it") from None
    if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise AttnkitError(f"the chat_template of {path} is not text; fix or remove it")
    return template


class ChatTemplate:
    """A compiled chat template and the special tokens it is given."""

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        self.source = DEFAULT_TEMPLATE if source is None else source
        self.is_default = source is None
        self.tokens = {"bos_token": bos_token, "eos_token": eos_token}
        env = _environment()
        try:
            parsed = env.parse(self.source)
            self.template = env.from_string(self.source)
        except jinja2.TemplateError as err:
            raise AttnkitError(f"the chat template does not compile: {err}") from None
        outside = next(parsed.find_all(_OUTSIDE), None)
        if outside is not None:
            tag = type(outside).__name__.lower().replace("fromimport", "from ... import")
            raise AttnkitError(
                f"the chat template uses {{% {tag} %}} (line {outside.lineno}), which reads "
                "another file; a chat template is one text: put what it reads in it"
            )

    def render(self, messages: list[dict[str, str]]) -> str:
        """The prompt of a conversation: messages of `role` and `content`, the last one to be
        answered. A developer message is a system message, as OpenAI's newer name for it."""
        messages = [
            {**m, "role": "system" if m["role"] == "developer" else m["role"]} for m in messages
        ]
        try:
            return self.template.render(
                messages=messages, add_generation_prompt=True, **self.tokens
            )
        except jinja2.TemplateError as err:
            raise ServeError(
                400, f"the model's chat template refuses these messages: {err}", param="messages"
            ) from None


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent)


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)
