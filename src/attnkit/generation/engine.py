"""`LLM`: a run loaded once, and many prompts decoded together, each by its own options.

    llm = LLM("runs/gpt")                       # loaded once
    llm.generate(["a dog", "the cat"], max_new_tokens=20)          # results, in order
    for piece in llm.stream("a dog", do_sample=True, seed=1): ...  # text as it comes
    request = llm.submit("a dog", config)       # a handle: iterate it, or .result()

As vLLM's and litgpt's `LLM` objects are: the prompts (a decoder's) or sources
(an encoder-decoder's) become rows of the batching engine that `attnkit serve`
runs (`generation/batching.py`), so they decode in one running batch, joining and
leaving it at every step; each row chooses its tokens by its own `GenerationConfig`
(transformers' names; stop strings and log-probabilities too). What the rows do not
decode (`ways.way`: beam search, `use_cache=False`, a monotonic window) runs as jobs
of the same engine's thread, the requests of one config grouped, like lengths
together, at most `max_batch` a job: a batched beam search, BEAM_STEPS steps a job
(`beam.sliced`: the rows decode between two of its slices), or the steps of `stream`
sent to each request (greedy and sampled tokens).
`attnkit generate`, `translate` and `eval` decode here (`inference.translate`,
`inference.complete`), as the server's rows do.

A source is prepared as the run reads its sources (`prepare_sources`), as
`attnkit translate` prepares it; a prompt longer than the model's context keeps
its last max_len - 1 tokens, as `attnkit generate` does. Ids already encoded go
in through `submit_ids`. A row that fails (its options make its scores overflow,
say) raises for its own request only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnkit.checks import check, of_type, positive_int
from attnkit.data.batch import pad
from attnkit.data.section import DataSection, prepare_sources
from attnkit.generation.batching import Scheduler
from attnkit.generation.beam import BeamSearch, sliced
from attnkit.generation.chooser import Choice
from attnkit.generation.config import GenerateOutput, GenerationConfig, on_ids, resolve
from attnkit.generation.requests import Completion, Request
from attnkit.generation.rows import Failed, Finish, Piece, end, take
from attnkit.generation.rows import Sequence as Row
from attnkit.generation.sampling import stream
from attnkit.generation.ways import COPY, ROWS, way
from attnkit.run import Run, load_run

log = logging.getLogger(__name__)

BEAM_STEPS = 4  # a beam search's decoding steps a job of the decoding thread


@dataclass(frozen=True)
class Loaded:
    """A model and its tokenizer already loaded, as a run gives them (`LLM.of`)."""

    model: Any
    tokenizer: Any
    data: DataSection = field(default_factory=DataSection)


class LLM:
    """A run folder (or a loaded `Run`) on the batching engine: `generate`, `stream`, `submit`.

    device and compute_type: where and in which type the run loads (`load_run`), when given
    a folder. max_batch: the most rows decoding at once (the others wait for a place), and
    the most requests of one job. kv_blocks: where rows decode on paged memory (the static
    cache, as on a GPU), the blocks of 16 positions a model's pool holds (None: max_batch
    rows of max_len; fewer make rows wait for blocks). Close it (or use it in a `with`
    block) to stop its decoding thread.
    """

    def __init__(
        self,
        run: Run | Loaded | str | Path,
        *,
        device: str = "cpu",
        compute_type: str = "float32",
        max_batch: int = 32,
        kv_blocks: int | None = None,
    ) -> None:
        positive_int("max_batch", max_batch)
        if kv_blocks is not None:
            positive_int("kv_blocks", kv_blocks)
        if isinstance(run, str | Path):
            run = load_run(run, device, compute_type=compute_type)
        self.run = run
        self.shape = self.run.model.config.shape
        check(
            self.shape in ("decoder", "encoder-decoder"),
            f"an LLM decodes with a decoder or an encoder-decoder, not an {self.shape} model; "
            "use Run.sentence_encoder() for sentence vectors",
        )
        check(
            way(self.run.model.config, GenerationConfig()) != COPY,
            "a pointer-generator's copied words need their source's vocabulary; translate with "
            "attnkit.inference.translate_run",
        )
        self.max_batch = max_batch
        self.scheduler = Scheduler(max_batch, kv_blocks=kv_blocks)

    @classmethod
    def of(cls, model: Any, tokenizer: Any, *, max_batch: int = 32) -> LLM:
        """An LLM over a model and tokenizer already loaded (its sources given as ids:
        `submit_ids`; as text, read without a run's preparation)."""
        return cls(Loaded(model, tokenizer), max_batch=max_batch)

    # -- what a caller uses ------------------------------------------------

    def submit(self, prompt: str, config: GenerationConfig | None = None, **options) -> Request:
        """Queue one prompt (a source, for an encoder-decoder) to decode by `config` and the
        keyword `options` (`GenerationConfig`'s fields); its `Request` at once."""
        (request,) = self.submit_all([prompt], config, **options)
        return request

    def submit_all(
        self,
        prompts: Sequence[str],
        config: GenerationConfig | Sequence[GenerationConfig] | None = None,
        **options,
    ) -> list[Request]:
        """Queue many prompts at once (so that those decoded as jobs are batched together);
        their `Request`s, in order. `config` is one for all or one a prompt."""
        check(not self.scheduler.closed, "this LLM is closed; make a new one")
        configs = list(config) if isinstance(config, list | tuple) else [config] * len(prompts)
        check(
            len(configs) == len(prompts),
            f"{len(configs)} configs for {len(prompts)} prompts; give one, or one a prompt",
        )
        for prompt in prompts:
            of_type("prompt", prompt, str, "give the prompt as text")
        configs = [self._config(one, options) for one in configs]
        ids = [self._encode(prompt) for prompt in prompts]
        return self.submit_ids(ids, configs, list(prompts))

    def submit_ids(
        self,
        ids: Sequence[list[int]],
        configs: Sequence[GenerationConfig],
        prompts: Sequence[str] | None = None,
        *,
        streamed: bool = True,
    ) -> list[Request]:
        """Queue prompts (sources) given as ids, each with its config (special ids resolved
        here); their `Request`s, in order. Each decodes by its `ways.way`: rows join the
        running batch; jobs go by config, like lengths together, `max_batch` a job.
        `streamed=False`: only the results are read, so each text is decoded once, at its
        end (as a piece) rather than token by token."""
        check(not self.scheduler.closed, "this LLM is closed; make a new one")
        model = self.run.model
        prompts = list(prompts) if prompts is not None else [""] * len(ids)
        requests = [
            Request(prompt, list(one), resolve(config, {}, model.config, self.run.tokenizer))
            for prompt, one, config in zip(prompts, ids, configs, strict=True)
        ]
        for request in requests:
            _one_output(request.config)
        rows: list[Row] = []
        jobs: dict[GenerationConfig, list[Request]] = {}
        for request in requests:
            if not request.ids:  # an empty source: an empty output, as `translate` gives
                request.events.put(Finish(0, "stop", 0, 0))
            elif way(model.config, request.config) == ROWS:
                emit = request.events.put
                request.row = Row(self.run, request.ids, request.config, emit, streamed=streamed)
                rows.append(request.row)
            else:
                jobs.setdefault(request.config, []).append(request)
        if rows:
            self.scheduler.add(rows)
        for config, group in jobs.items():
            # a seeded sample draws as `generate` does alone; a batch's draws would differ
            size = 1 if config.do_sample and config.seed is not None else self.max_batch
            group = sorted(group, key=lambda r: len(r.ids), reverse=True)
            for start in range(0, len(group), size):
                self._submit_job(group[start : start + size], streamed)
        return requests

    def generate(
        self,
        prompts: str | Sequence[str],
        config: GenerationConfig | Sequence[GenerationConfig] | None = None,
        **options,
    ) -> list[Completion]:
        """Every prompt's `Completion`, in order, the prompts decoded together; `config` is
        one for all or one a prompt, `options` apply to each."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        requests = self.submit_all(prompts, config, **options)
        try:
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

    # -- on the way in ------------------------------------------------------

    def _config(self, config: GenerationConfig | None, options: dict) -> GenerationConfig:
        model = self.run.model
        config = resolve(config, options, model.config, self.run.tokenizer)
        _one_output(config)
        if config.num_beams > 1:
            on_ids(config)  # a beam search ranks whole hypotheses: no stop strings, logprobs
        elif config.logprobs is not None:
            check(
                way(model.config, config) == ROWS,
                "logprobs come from the batching engine's rows, which use_cache=False and "
                "monotonic_window (options of generate) leave; drop them to get logprobs",
            )
        return config

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

    # -- jobs: what the rows do not decode ----------------------------------

    def _submit_job(self, group: list[Request], streamed: bool) -> None:
        if group[0].config.num_beams > 1:  # a few steps a job: the rows step between two
            future = sliced(self.scheduler, lambda: self._search(group), BEAM_STEPS)
            future.add_done_callback(lambda done: self._searched(group, done))
        else:
            future = self.scheduler.submit(self._job, group, streamed)
        for request in group:
            request.job, request.group = future, group

        def cancelled(done: Future) -> None:  # closed, or every caller gone: each hears it
            if done.cancelled():
                for request in group:
                    request.events.put(Failed(0, RuntimeError("the job was cancelled")))

        future.add_done_callback(cancelled)

    def _search(self, group: list[Request]) -> BeamSearch:
        """The beam search of a group of requests of one config, its prefix run."""
        model = self.run.model
        ids, mask = pad([r.ids for r in group], self.run.tokenizer.pad_id)
        return BeamSearch(model, ids.to(model.device), mask.to(model.device), group[0].config)

    def _searched(self, group: list[Request], done: Future) -> None:
        if done.cancelled():  # `_submit_job`'s callback tells each request
            return
        try:
            self._whole(group, done.result())
        except Exception as error:  # the search's, or its texts': each request hears it
            for request in group:
                request.events.put(Failed(0, error))

    def _job(self, group: list[Request], streamed: bool) -> None:
        """Decode a group of requests of one config that the rows do not take (`use_cache=False`,
        a monotonic window) on the decoding thread, step by step, each token sent to its
        request as it comes."""
        model, tokenizer = self.run.model, self.run.tokenizer
        try:
            ids, mask = pad([r.ids for r in group], tokenizer.pad_id)
            ids, mask = ids.to(model.device), mask.to(model.device)
            self._steps(group, stream(model, ids, mask, group[0].config), streamed)
        except Exception as error:  # each request of the job hears it
            for request in group:
                request.events.put(Failed(0, error))

    def _whole(self, group: list[Request], out: GenerateOutput) -> None:
        tokenizer, config = self.run.tokenizer, group[0].config
        new, n = out.new_tokens(), config.num_return_sequences
        scores = out.sequences_scores
        scores = [None] * len(new) if scores is None else scores.tolist()
        for k, request in enumerate(group):
            mine = range(k * n, (k + 1) * n)
            context = request.ids if self.shape == "decoder" else []
            texts = [tokenizer.decode_continuation(context, new[i]) for i in mine]
            request.whole_ids = new[k * n]
            request.n_best = [(text, scores[i]) for text, i in zip(texts, mine, strict=True)]
            reason = "length" if len(new[k * n]) >= config.max_new_tokens else "stop"
            request.events.put(Piece(0, texts[0], []))
            request.events.put(Finish(0, reason, len(request.ids), len(new[k * n])))

    def _steps(self, group: list[Request], steps: Iterator[torch.Tensor], streamed: bool) -> None:
        rows = [Row(self.run, r.ids, r.config, r.events.put, streamed=streamed) for r in group]
        for request, row in zip(group, rows, strict=True):
            request.row = row
            row.cancelled = request.cancelled
        going = list(range(len(rows)))
        try:
            for step in steps:
                tokens = step.tolist()
                going = [
                    i for i in going if not rows[i].cancelled and take(rows[i], Choice(tokens[i]))
                ]
                if not going:
                    break
        finally:
            steps.close()  # type: ignore[attr-defined]
        for i in going:  # the decode stopped short of max_new_tokens: the model's max_len
            if not rows[i].cancelled:
                end(rows[i], "length")


def _one_output(config: GenerationConfig) -> None:
    check(
        config.num_return_sequences == 1 or config.num_beams > 1,
        "an LLM gives one output a prompt (a beam search its n best); submit the prompt "
        "again (with another seed) for more",
    )
