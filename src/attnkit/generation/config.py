"""What decoding is asked to do and what it returns: `GenerationConfig` and `GenerateOutput`.

Option names follow Hugging Face `generate`, so a configuration reads the same
in both; the few HF lacks take vLLM's and OpenAI's (`presence_penalty`,
`frequency_penalty`, `logit_bias`, `logprobs`). One record serves a whole
`generate` call and each row of the batching engine (`generation/batching.py`),
where every row decodes by its own. The special ids (EOS, padding, the
decoder's first input) default to the tokenizer's, when one is given, else the
model's own (`ModelConfig.eos_id`, `pad_id`, `decoder_start_id`); `resolve`
fills them in once, before decoding starts, for every entry point.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from attnkit.checks import (
    check,
    choice,
    finite_fields,
    known,
    non_negative_int,
    of_type,
    positive,
    positive_int,
    seed_value,
    within,
)
from attnkit.config import ModelConfig
from attnkit.tokenizer import Tokenizer

CACHES = ("auto", "dynamic", "static")


@dataclass(frozen=True)
class GenerationConfig:
    """Decoding options, named as in Hugging Face `generate`.

    max_new_tokens / min_new_tokens: bounds on the generated length (EOS
        is suppressed before min_new_tokens).
    do_sample: sample instead of taking the argmax; temperature, top_k
        (0: off), top_p (1: off) shape the distribution sampled from.
    repetition_penalty: divides positive (multiplies negative) scores of
        tokens already in the sequence; 1 is off.
    no_repeat_ngram_size: forbid repeating any n-gram of this size; 0 is off.
    num_beams, length_penalty, early_stopping (True, False or "never"),
        num_return_sequences: beam search as in HF.
    eos_token_id: one id or several; None is the model's `eos_id` (none if
        the model has none); () decodes to max_new_tokens.
    pad_token_id: fills finished rows; None is the model's `pad_id`.
    decoder_start_token_id: first decoder input of an encoder-decoder; None
        is the model's `decoder_start_id` (Marian uses its pad id).
    suppress_tokens: ids never generated; forced_eos_token_id: forced at the last step.
    presence_penalty / frequency_penalty: subtracted from the score of each token already
        generated, once / once per time it was (OpenAI's and vLLM's names; 0 is off).
    logit_bias: {token id: bias} (or (id, bias) pairs) added to those tokens' scores first.
    stop_strings: texts that end an output where they begin, left out of it (the batching
        engine's rows: `attnkit.LLM` and the server; `generate` works on ids, not text).
    logprobs: report each chosen token's log-probability and this many most likely
        alternatives (0: the chosen token's alone); None reports none (the batching engine).
    seed: makes sampling reproducible.
    use_cache: False recomputes every position at every step (for comparison only).
    cache_implementation: `auto` (the default), the fastest that serves: `static` on a CUDA
        device, where it serves the model and the decode fits max_len, else `dynamic`
        (`static_cache.chosen`); `dynamic`, the cache that grows and drops finished rows; or
        `static` (HF's name), fixed buffers and the decoding step compiled by torch.compile,
        replayed as one CUDA graph on a GPU (`generation/static_cache.py`): much faster where
        a step is bound by kernel launches, after a compilation on first use. Greedy,
        sampled and beam decoding of models without a ring window, monotonic window or
        copying; others decode on the dynamic cache. On a GPU the next call of the same
        shapes decodes on the same buffers, which stay allocated between calls
        (`static_cache.release_all` frees them).
    crop_context: a decoder-only model that greedy-decodes or samples past its
        max_len goes on conditioned on the last max_len tokens (nanoGPT's crop);
        False stops it at max_len. Beam search and encoder-decoders always stop.
    monotonic_window: (back, ahead), for an encoder-decoder on the KV cache:
        at each step every decoder layer's cross-attention sees only the source
        positions within [f - back, f + ahead] of a focus f, which starts at the
        first source token and moves to where the last layer attended most
        (averaged over heads) at the step before; for monotonic tasks
        (grapheme-to-phoneme, speech). None is off. Not an HF option.
    """

    max_new_tokens: int = 20
    min_new_tokens: int = 0
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    num_return_sequences: int = 1
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    decoder_start_token_id: int | None = None
    suppress_tokens: tuple[int, ...] = field(default_factory=tuple)
    forced_eos_token_id: int | None = None
    seed: int | None = None
    use_cache: bool = True
    cache_implementation: str = "auto"
    crop_context: bool = True
    monotonic_window: tuple[int, int] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    stop_strings: tuple[str, ...] = ()
    logprobs: int | None = None

    def __post_init__(self) -> None:
        finite_fields(self)  # NaN passes no comparison: length_penalty has none of its own
        positive_int("max_new_tokens", self.max_new_tokens)
        if self.seed is not None:
            seed_value("seed", self.seed)
        non_negative_int("min_new_tokens", self.min_new_tokens, zero="no minimum")
        within("min_new_tokens", self.min_new_tokens, f"[0, {self.max_new_tokens}]")
        positive("temperature", self.temperature)
        non_negative_int("top_k", self.top_k)
        within("top_p", self.top_p, "(0, 1]")
        positive("repetition_penalty", self.repetition_penalty)
        non_negative_int("no_repeat_ngram_size", self.no_repeat_ngram_size)
        positive_int("num_beams", self.num_beams)
        positive_int("num_return_sequences", self.num_return_sequences)
        choice("cache_implementation", self.cache_implementation, CACHES)
        check(
            self.early_stopping in (True, False, "never"),
            f"early_stopping must be True, False or 'never', got {self.early_stopping!r}",
        )
        check(
            not (self.do_sample and self.num_beams > 1),
            "sampling and beam search do not combine here; use do_sample or num_beams > 1",
        )
        check(
            self.num_return_sequences <= self.num_beams or self.do_sample,
            f"num_return_sequences {self.num_return_sequences} needs num_beams at least as "
            "large, or do_sample",
        )
        if self.monotonic_window is not None:
            window = self.monotonic_window
            check(
                isinstance(window, list | tuple)
                and len(window) == 2
                and all(_is_count(n) for n in window)
                and window[1] >= 1,
                "monotonic_window must be two integers, back of zero or more and ahead of one "
                "or more (a focus that cannot move ahead never leaves the first token), "
                f"(back, ahead), got {self.monotonic_window!r}",
            )
            check(
                self.use_cache,
                "monotonic_window moves its focus on the KV cache, which use_cache=False "
                "turns off; set use_cache=True",
            )
            object.__setattr__(self, "monotonic_window", tuple(window))
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        object.__setattr__(self, "suppress_tokens", tuple(self.suppress_tokens))
        self._check_row_options()

    def _check_row_options(self) -> None:
        """The options beside HF's: penalties, biases, stop strings, log-probabilities; each
        stored as a tuple, so that a config stays hashable (a key of batched work)."""
        bias = self.logit_bias
        pairs = list(bias.items()) if isinstance(bias, dict) else bias
        check(
            isinstance(pairs, list | tuple)
            and all(isinstance(p, list | tuple) and len(p) == 2 for p in pairs)
            and all(_is_count(i) and _is_number(b) for i, b in pairs),
            "logit_bias must map token ids (integers of zero or more) to finite numbers, "
            f"got {bias!r}",
        )
        object.__setattr__(self, "logit_bias", tuple((i, float(b)) for i, b in pairs))
        for _, value in self.logit_bias:
            check(math.isfinite(value), f"a logit_bias must be finite, got {value}")
        stops = (self.stop_strings,) if isinstance(self.stop_strings, str) else self.stop_strings
        check(
            isinstance(stops, list | tuple) and all(isinstance(s, str) for s in stops),
            f"stop_strings must be strings, got {self.stop_strings!r}",
        )
        object.__setattr__(self, "stop_strings", tuple(s for s in stops if s))
        if self.logprobs is not None:
            non_negative_int("logprobs", self.logprobs, zero="the chosen token's alone")

    @property
    def greedy(self) -> bool:
        """Whether each token is the argmax (no sampling, no beams): greedy outputs of one
        prompt are all the same."""
        return not self.do_sample and self.num_beams == 1

    @property
    def adjusts(self) -> bool:
        """Whether a logits processor changes the scores before a token is chosen."""
        return bool(
            self.repetition_penalty != 1.0
            or self.no_repeat_ngram_size
            or self.min_new_tokens
            or self.suppress_tokens
            or self.forced_eos_token_id is not None
            or self.logit_bias
            or self.presence_penalty
            or self.frequency_penalty
        )

    @property
    def eos_ids(self) -> tuple[int, ...]:
        eos = self.eos_token_id
        return () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)


def _is_count(value: object) -> bool:
    """An integer (not a bool) of zero or more."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def tokenizer_ids(tokenizer: Tokenizer, model: ModelConfig) -> dict[str, Any]:
    """The special ids a run's tokenizer gives decoding: its end token (none: decode to
    max_new_tokens), its padding, and for an encoder-decoder its start token (else the
    model's `decoder_start_id`)."""
    ids: dict[str, Any] = {
        "eos_token_id": tokenizer.eos_id if tokenizer.has("eos") else (),
        "pad_token_id": tokenizer.pad_id if tokenizer.has("pad") else model.pad_id,
    }
    if model.shape == "encoder-decoder" and tokenizer.has("bos"):
        ids["decoder_start_token_id"] = tokenizer.bos_id
    return ids


def resolve(
    config: GenerationConfig | None,
    options: dict[str, Any],
    model: ModelConfig,
    tokenizer: Tokenizer | None = None,
) -> GenerationConfig:
    """`config` with `options` applied and every special id not given made explicit: the
    tokenizer's when one is given (`tokenizer_ids`), else the model's.

    A model without `eos_id` decodes to max_new_tokens, as Hugging Face's does;
    an encoder-decoder needs a decoder start id from its config or the caller.
    """
    if config is not None:
        of_type(
            "config", config, GenerationConfig, "give options as keywords, or GenerationConfig(...)"
        )
    config = config or GenerationConfig()
    names = [f.name for f in dataclasses.fields(GenerationConfig)]
    known("option", options, names, owner="generate", otherwise="see GenerationConfig")
    config = dataclasses.replace(config, **options) if options else config
    ids: dict[str, Any] = {}
    if tokenizer is not None:
        given = tokenizer_ids(tokenizer, model)
        ids = {name: value for name, value in given.items() if getattr(config, name) is None}
        config = dataclasses.replace(config, **ids) if ids else config
        ids = {}
    if config.eos_token_id is None:
        ids["eos_token_id"] = () if model.eos_id is None else model.eos_id
    if config.pad_token_id is None:
        ids["pad_token_id"] = model.pad_id
    if config.decoder_start_token_id is None and model.shape == "encoder-decoder":
        check(
            model.decoder_start_id is not None,
            "this encoder-decoder model's config has no decoder_start_id; pass "
            "decoder_start_token_id (the id its decoder reads first, e.g. the tokenizer's bos_id)",
        )
        ids["decoder_start_token_id"] = model.decoder_start_id
    return dataclasses.replace(config, **ids) if ids else config


def on_ids(config: GenerationConfig) -> GenerationConfig:
    """`config`, refused when it asks for what only the batching engine's rows give: text
    cut at a stop string, reported log-probabilities (`generate` returns ids)."""
    check(
        not config.stop_strings and config.logprobs is None,
        "stop_strings and logprobs are options of the batching engine, which decodes text "
        "(attnkit.LLM, attnkit serve); generate returns ids: leave them out",
    )
    return config


@dataclass
class GenerateOutput:
    """What `generate` returns.

    sequences: (batch * num_return_sequences, prefix + generated) ids, as HF
        returns them: the prefix is the decoder start token of an
        encoder-decoder or the (left-padded) prompt of a decoder-only model;
        after a row's EOS comes padding.
    sequences_scores: beam search's length-penalised score of each sequence.
    prefix_length: columns of `sequences` before the generated tokens.
    eos_token_ids: where `new_tokens` cuts each sequence.
    """

    sequences: Tensor
    sequences_scores: Tensor | None
    prefix_length: int
    eos_token_ids: tuple[int, ...]

    def new_tokens(self) -> list[list[int]]:
        """The generated ids of each sequence, up to (not including) its first EOS."""
        result = []
        for row in self.sequences[:, self.prefix_length :].tolist():
            cut = next((i for i, t in enumerate(row) if t in self.eos_token_ids), len(row))
            result.append(row[:cut])
        return result
