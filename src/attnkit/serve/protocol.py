"""The request bodies: OpenAI's completions, chat completions and embeddings, attnkit's
translations and attention views, with every parameter either honoured or refused.

Each field of OpenAI's requests is here: the ones attnkit honours with their
ranges (a value out of range is a 400 naming it), and the ones it cannot honour
(tools, audio, structured output, `suffix`, ...) accepted only at the value that
asks for nothing, else refused by `refusals` with a 400 that names the field. A
field OpenAI does not have is refused as OpenAI refuses it ("unrecognized
request argument"), but for the extensions vLLM users know: `top_k` and
`repetition_penalty` (Hugging Face's meaning) and, for embeddings, TEI's `truncate`.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from attnkit.generation import GenerationConfig
from attnkit.serve.errors import ServeError, invalid

MAX_OUTPUTS = 16  # outputs (n, best_of), beams or n-best a request may ask for
MAX_STOPS = 4  # stop strings, as OpenAI allows
# The least values that can be computed: below them float32 logits overflow (temperature,
# repetition_penalty divide them) or every token is dropped (top_p), for one row or the batch
MIN_TEMPERATURE = 1e-4
MIN_TOP_P = 1e-6
MIN_REPETITION_PENALTY = 1e-2
_TOKEN_ID = re.compile(r"[0-9]{1,10}")  # ASCII digits only: "²" or "٣" is no token id


def _temperature(value: float | None) -> float | None:
    if value is not None and 0 < value < MIN_TEMPERATURE:
        raise ValueError(
            f"must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, not {value:g}: smaller ones "
            "overflow the logits"
        )
    return value


Texts = str | list[str] | list[int] | list[list[int]]  # text(s), or token ids


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str

    def refusals(self) -> None:
        """Raise the 400 of the first field set to something this server cannot do."""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool | None = False


class _Sampled(_Body):
    """What completions and chat completions share: how tokens are chosen and sent."""

    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=MIN_TOP_P, le=1)
    n: int | None = Field(None, ge=1, le=MAX_OUTPUTS)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    user: str | None = None  # the caller's name for its user: no effect on the output
    top_k: int | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, ge=MIN_REPETITION_PENALTY, le=10)

    LOGPROBS: ClassVar[str] = "logprobs"  # the field that asks for alternatives

    _check_temperature = field_validator("temperature")(_temperature)

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOPS:
            raise invalid("stop", f"stop takes at most {MAX_STOPS} strings, not {len(stops)}.")
        return tuple(s for s in stops if s)

    def sampling(
        self, max_tokens: int, vocab_size: int, logprobs: int | None = None
    ) -> GenerationConfig:
        """The `GenerationConfig` of each output, OpenAI's names mapped onto transformers'
        (temperature 0: greedy); `logit_bias` ids are checked against the vocabulary."""
        bias = []
        for key, value in (self.logit_bias or {}).items():
            if not _TOKEN_ID.fullmatch(key) or int(key) >= vocab_size:
                raise invalid(
                    "logit_bias",
                    f"logit_bias keys are token ids from 0 to {vocab_size - 1}, not {key!r}.",
                )
            if not -100 <= value <= 100:
                raise invalid("logit_bias", f"a logit_bias is from -100 to 100, not {value}.")
            bias.append((int(key), float(value)))
        if logprobs is not None and logprobs > vocab_size:
            raise invalid(
                self.LOGPROBS,
                f"{self.LOGPROBS} asks for {logprobs} alternatives, but the model has "
                f"{vocab_size} tokens in all.",
            )
        if self.stream_options is not None and not self.stream:
            raise invalid("stream_options", "stream_options is only for stream: true.")
        temperature = 1.0 if self.temperature is None else self.temperature
        return GenerationConfig(
            max_new_tokens=max(max_tokens, 1),  # 0 (an echo alone) is not decoded
            do_sample=temperature > 0,
            temperature=temperature or 1.0,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=self.repetition_penalty or 1.0,
            logit_bias=tuple(bias),
            seed=None if self.seed is None else self.seed % 2**63,
            stop_strings=self.stops(),
            logprobs=logprobs,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampled):
    prompt: Texts
    max_tokens: int | None = Field(16, ge=0)  # None: as many as the server allows
    echo: bool | None = False
    logprobs: int | None = Field(None, ge=0, le=20)
    best_of: int | None = Field(None, ge=1, le=MAX_OUTPUTS)
    suffix: str | None = None

    def refusals(self) -> None:
        if self.suffix:
            raise ServeError(
                400,
                "suffix asks a model to fill in text before a given end, which attnkit's "
                "models are not trained to do; leave it out.",
                param="suffix",
                code="unsupported_parameter",
            )
        n = self.n or 1
        best_of = self.best_of or n
        if best_of < n:
            raise invalid("best_of", f"best_of ({best_of}) must be at least n ({n}).")
        if best_of > n and self.stream:
            raise invalid("best_of", "best_of cannot stream: the best is known only at the end.")
        if self.max_tokens == 0 and not self.echo:
            raise invalid("max_tokens", "max_tokens 0 asks for nothing; it needs echo: true.")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart | dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    function_call: dict[str, Any] | None = None
    refusal: str | None = None

    def text(self, where: str) -> str:
        """The message's text: its content, or its text parts joined."""
        if self.tool_calls or self.function_call or self.role in ("tool", "function"):
            raise _unsupported(where, "tool and function calls")
        if isinstance(self.content, str) or self.content is None:
            return self.content or ""
        parts = []
        for i, part in enumerate(self.content):
            if not isinstance(part, TextPart):
                kind = part.get("type", "unknown") if isinstance(part, dict) else "unknown"
                raise _unsupported(f"{where}.content.{i}", f"{kind} content (text only)")
            parts.append(part.text)
        return "".join(parts)


class ChatRequest(_Sampled):
    LOGPROBS: ClassVar[str] = "top_logprobs"

    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    modalities: list[str] | None = None
    prediction: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None  # a caching hint: nothing is cached across requests
    safety_identifier: str | None = None  # the caller's name for its user, like `user`

    def refusals(self) -> None:
        asked = {
            "tools": bool(self.tools),
            "tool_choice": self.tool_choice not in (None, "none"),
            "functions": bool(self.functions),
            "function_call": self.function_call not in (None, "none"),
            "audio": self.audio is not None,
            "modalities": self.modalities not in (None, ["text"]),
            "prediction": self.prediction is not None,
            "reasoning_effort": self.reasoning_effort is not None,
            "verbosity": self.verbosity is not None,
            "web_search_options": self.web_search_options is not None,
        }
        for param, set_ in asked.items():
            if set_:
                raise _unsupported(param, param.replace("_", " "))
        if self.response_format not in (None, {"type": "text"}):
            raise _unsupported("response_format", "structured output (only {'type': 'text'})")
        if self.store:
            raise _unsupported("store", "storing completions")
        if self.metadata and not self.store:
            raise invalid("metadata", "metadata goes with store: true, which this server lacks.")
        if self.service_tier not in (None, "auto", "default"):
            raise _unsupported("service_tier", f"the {self.service_tier!r} service tier")
        if self.top_logprobs and not self.logprobs:
            raise invalid("top_logprobs", "top_logprobs needs logprobs: true.")

    @property
    def new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class EmbeddingRequest(_Body):
    input: Texts
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None
    truncate: bool | None = False  # TEI's: cut inputs over the limit instead of refusing them


class TranslationRequest(_Body):
    texts: list[str]
    beam: int = Field(1, ge=1, le=MAX_OUTPUTS)
    length_penalty: float = 1.0
    sample: bool = False
    temperature: float = Field(1.0, ge=MIN_TEMPERATURE)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, ge=MIN_TOP_P, le=1)
    n_best: int = Field(1, ge=1, le=MAX_OUTPUTS)
    max_new_tokens: int = Field(128, ge=1)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stream: bool = False
    attention: bool = False  # also the attention of each text and its (first) translation

    def refusals(self) -> None:
        if self.sample and self.beam > 1:
            raise invalid("beam", "sampling and beam search do not combine; choose one.")
        if self.n_best > self.beam and not self.sample:
            raise invalid(
                "n_best", f"n_best {self.n_best} needs a beam at least as wide, not {self.beam}."
            )
        if self.stream and (len(self.texts) != 1 or self.beam != 1 or self.n_best != 1):
            raise invalid("stream", "a streamed translation takes one text, beam 1 and n_best 1.")


class AttentionRequest(_Body):
    text: str
    output: str | None = None  # the output to look at (the page's); None: the model's own


def _unsupported(param: str, what: str) -> ServeError:
    return ServeError(
        400,
        f"this server does not support {what}; leave {param} out.",
        param=param,
        code="unsupported_parameter",
    )
