"""`LLM`: a run loaded once, and many prompts decoded together, each by its own options.

    llm = LLM("runs/gpt")                       # loaded once
    llm.generate(["a dog", "the cat"], max_new_tokens=20)          # results, in order
    for piece in llm.stream("a dog", do_sample=True, seed=1): ...  # text as it comes
    request = llm.submit("a dog", config)       # a handle: iterate it, or .result()

As vLLM's and litgpt's `LLM` objects are: the prompts (a decoder's) or sources
(an encoder-decoder's) become rows of the batching engine that `attnkit serve`
runs (`generation/batching.py`), so they decode in one running batch, joining and
leaving it at every step; each row chooses its tokens by its own `GenerationConfig`
(transformers' names; stop strings and log-probabilities too). Beam search, which
ranks whole hypotheses, runs as one job of the same engine's thread.

A source is prepared as the run reads its sources (`prepare_sources`), as
`attnkit translate` prepares it; a prompt longer than the model's context keeps
its last max_len - 1 tokens, as `attnkit generate` does. A row that fails (its
options make its scores overflow, say) raises for its own request only.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch

from attnkit.checks import check, of_type, positive_int
from attnkit.data.section import prepare_sources
from attnkit.errors import AttnkitError
from attnkit.generation.batching import Scheduler
from attnkit.generation.config import GenerationConfig, on_ids, resolve
from attnkit.generation.decode import generate
from attnkit.generation.rows import Failed, Finish, Piece, Token
from attnkit.generation.rows import Sequence as Row
from attnkit.run import Run, load_run

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Completion:
    """One prompt's output: its text and ids (the end token left out), why it ended (`stop`:
    an end token or a stop string; `length`: max_new_tokens spent), the prompt's tokens, and,
    when `logprobs` was asked, each chosen token with its log-probability and alternatives."""

    prompt: str
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    logprobs: list[Token] | None = None


class Request:
    """A prompt submitted to an `LLM`: iterate it for its text as it comes, or wait for its
    `result()`; `cancel()` lets it leave the batch at the next step."""

    def __init__(self, prompt: str, ids: list[int], config: GenerationConfig) -> None:
        self.prompt, self.ids, self.config = prompt, ids, config
        self.events: queue.Queue = queue.Queue()
        self.row: Row | None = None
        self.job: Future | None = None
        self.beam_ids: list[int] | None = None  # a beam search's output, from its job
        self._done: Completion | None = None
        self._error: AttnkitError | None = None
        self._text: list[str] = []
        self._tokens: list[Token] = []

    def __iter__(self) -> Iterator[str]:
        """Each piece the text grows by, until the output ends; raises if it fails."""
        try:
            while self._done is None:
                piece = self._next()
                if piece:
                    yield piece
        finally:
            if self._done is None:  # the caller stopped reading: decode no further
                self.cancel()

    def result(self, timeout: float | None = None) -> Completion:
        """The whole output, once it has ended (waiting at most `timeout` seconds a token)."""
        while self._done is None:
            self._next(timeout)
        return self._done

    def cancel(self) -> None:
        if self.row is not None:
            self.row.cancelled = True
        if self.job is not None:
            self.job.cancel()

    def _next(self, timeout: float | None = None) -> str:
        """Take one event: its text (a piece), or the end recorded; a failure raised."""
        if self._error is not None:
            raise self._error
        try:
            event = self.events.get(timeout=timeout)
        except queue.Empty:
            raise AttnkitError(f"no token came within {timeout:g} s") from None
        if isinstance(event, Failed):
            self._error = AttnkitError(
                f"decoding {self.prompt[:40]!r} failed ({type(event.error).__name__}: "
                f"{event.error}); change its options"
            )
            raise self._error from event.error
        if isinstance(event, Piece):
            self._text.append(event.text)
            self._tokens += event.tokens
            return event.text
        ids = list(self.row.output) if self.row is not None else self.beam_ids or []
        self._done = Completion(
            self.prompt,
            "".join(self._text),
            ids,
            event.reason,
            event.prompt_tokens,
            self._tokens if self.config.logprobs is not None else None,
        )
        return ""


class LLM:
    """A run folder (or a loaded `Run`) on the batching engine: `generate`, `stream`, `submit`.

    device and compute_type: where and in which type the run loads (`load_run`), when given
    a folder. max_batch: the most rows decoding at once; the others wait for a place.
    Close it (or use it in a `with` block) to stop its decoding thread.
    """

    def __init__(
        self,
        run: Run | str | Path,
        *,
        device: str = "cpu",
        compute_type: str = "float32",
        max_batch: int = 32,
    ) -> None:
        positive_int("max_batch", max_batch)
        self.run = run if isinstance(run, Run) else load_run(run, device, compute_type=compute_type)
        self.shape = self.run.model.config.shape
        check(
            self.shape in ("decoder", "encoder-decoder"),
            f"an LLM decodes with a decoder or an encoder-decoder, not an {self.shape} model; "
            "use Run.sentence_encoder() for sentence vectors",
        )
        check(
            self.run.model.config.copy_attention == "none",
            "a pointer-generator's copied words need their source's vocabulary; translate with "
            "attnkit.inference.translate_run",
        )
        self.scheduler = Scheduler(max_batch)

    # -- what a caller uses ------------------------------------------------

    def submit(self, prompt: str, config: GenerationConfig | None = None, **options) -> Request:
        """Queue one prompt (a source, for an encoder-decoder) to decode by `config` and the
        keyword `options` (`GenerationConfig`'s fields); its `Request` at once."""
        check(not self.scheduler.closed, "this LLM is closed; make a new one")
        of_type("prompt", prompt, str, "give the prompt as text")
        config = resolve(config, options, self.run.model.config, self.run.tokenizer)
        check(
            config.num_return_sequences == 1,
            "an LLM gives one output a prompt; submit the prompt again (with another seed) "
            "for more",
        )
        check(
            config.use_cache and config.monotonic_window is None,
            "use_cache=False and monotonic_window are options of generate(), not of the "
            "batching engine",
        )
        if config.num_beams > 1:
            on_ids(config)  # a beam search ranks whole hypotheses: no stop strings, logprobs
        ids = self._encode(prompt)
        request = Request(prompt, ids, config)
        if not ids:  # an empty source: an empty output, as `translate` gives
            request.events.put(Finish(0, "stop", 0, 0))
        elif config.num_beams > 1:
            request.job = self.scheduler.submit(self._beam, request)
        else:
            request.row = Row(self.run, ids, config, request.events.put)
            self.scheduler.add([request.row])
        return request

    def generate(
        self,
        prompts: str | Sequence[str],
        config: GenerationConfig | Sequence[GenerationConfig] | None = None,
        **options,
    ) -> list[Completion]:
        """Every prompt's `Completion`, in order, the prompts decoded together; `config` is
        one for all or one a prompt, `options` apply to each."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        configs = list(config) if isinstance(config, list | tuple) else [config] * len(prompts)
        check(
            len(configs) == len(prompts),
            f"{len(configs)} configs for {len(prompts)} prompts; give one, or one a prompt",
        )
        requests = []
        try:
            for prompt, one in zip(prompts, configs, strict=True):
                requests.append(self.submit(prompt, one, **options))
            return [r.result() for r in requests]
        finally:
            for request in requests:
                request.cancel()

    def stream(self, prompt: str, config: GenerationConfig | None = None, **options):
        """The text of one prompt's output, piece by piece, as its tokens are chosen."""
        return iter(self.submit(prompt, config, **options))

    def close(self) -> None:
        """Stop the decoding thread; outputs still decoding fail."""
        self.scheduler.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- on the way in, and beam search ------------------------------------

    def _encode(self, prompt: str) -> list[int]:
        run, max_len = self.run, self.run.model.config.max_len
        tokenizer = run.tokenizer
        if self.shape == "encoder-decoder":
            (source,) = prepare_sources(run.data, [prompt])
            if not source.strip():
                return []
            return tokenizer.encode_batch([source], add_eos=True, max_length=max_len)[0]
        ids = tokenizer.encode(prompt) or [tokenizer.bos_id]
        if len(ids) >= max_len:
            log.warning("the prompt has %d tokens; keeping its last %d", len(ids), max_len - 1)
            ids = ids[-(max_len - 1) :]
        return ids

    def _beam(self, request: Request) -> None:
        """Beam search of one request, as a job of the decoding thread."""
        model, tokenizer = self.run.model, self.run.tokenizer
        config = request.config
        try:
            ids = torch.tensor([request.ids], device=model.device)
            (new,) = generate(model, ids, config=config).new_tokens()
        except Exception as error:  # this request hears it
            request.events.put(Failed(0, error))
            return
        request.beam_ids = new
        reason = "length" if len(new) >= config.max_new_tokens else "stop"
        request.events.put(Piece(0, tokenizer.decode(new), []))
        request.events.put(Finish(0, reason, len(request.ids), len(new)))
