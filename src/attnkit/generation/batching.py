"""Iteration-level batching: outputs join and leave the running batch at every decoding step.

    loop:  admit waiting outputs (one batched prefill, their first tokens)
           one `decode_step` of every running row on the shared KV cache
           each row's next token by its own config (`chooser.choose`)
           rows that end (end token, stop string, max_new_tokens, caller gone) leave

(Orca, Yu et al. 2022.) A request does not wait for a batch to form nor for
the longest output of its batch to end: it joins the rows already decoding at
the next step, and its tokens leave as they are chosen. Rows share one KV cache,
right-aligned and left-padded (`cache_rows`), so a row computes exactly what it
would alone. A decoder's row whose context is full goes on as `generate` does
(nanoGPT's crop): each step reruns its last max_len tokens. One model's rows
decode together; several models take turns, step by step.

One thread does all the model's work (torch uses its own threads inside each
operation): the steps, and between steps the jobs handed to it as to an executor
(`submit`: embeddings, beam search, attention views), so no two computations
compete for the cores. Tokens reach their caller (the server's event loop,
`attnkit.LLM`) through each output's `emit`. A row whose token choice fails (its
options overflow the scores, say) is failed alone: the others of its batch go on.
A model whose cache cannot take rows mid-way (a sliding window's ring, alignments
carried beside it: `cache_rows.joinable`) decodes in cohorts: the outputs admitted
together, each leaving when it ends. A pointer-generator's copied words need the
source's own vocabulary (`inference.translate`), so it is not decoded here.

Where `static_cache.chosen` takes the static cache (`auto` on a CUDA device, or
`static` asked) and rows may join (`cache_rows.joinable`), rows decode on paged memory
(`paged_cache`): blocks of a shared pool, and a step compiled once per batch size
(CUDA graphs on a GPU), which rows joining and leaving never recompile.

This is the engine every caller that decodes many requests at once shares: the
server's routes and `attnkit.LLM` hand it `rows.Sequence`s.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Executor, Future
from typing import Any

import torch

from attnkit.data.batch import pad
from attnkit.generation import cache_rows, static_cache
from attnkit.generation.chooser import choose
from attnkit.generation.paged_cache import PagedMemory, PagedRow
from attnkit.generation.paged_rows import PagedModels
from attnkit.generation.rows import Failed, Sequence, end, take
from attnkit.generation.state import left_pad
from attnkit.models.decoding_state import DecodingState
from attnkit.nn.alignment_state import AlignmentState
from attnkit.nn.kv_cache import KVCache

log = logging.getLogger(__name__)


class _Batch:
    """Running rows of one model: their cache and the token each feeds next.

    A shared batch takes new rows at any step (`cache_rows.join`, or paged: `memory`, each
    row's `blocks`); a cohort, for a model whose cache cannot (`cache_rows.joinable`), keeps
    its first rows, and the alignments location-aware or monotonic attention carries.
    """

    def __init__(self, served: Any, shared: bool, paged: bool = False) -> None:
        self.served, self.shared, self.paged = served, shared, paged
        self.memory: PagedMemory | None = None  # the paged memory, once its first rows come
        self.blocks: dict[Sequence, PagedRow] = {}
        self.cache: KVCache | None = None
        self.alignment: AlignmentState | None = None
        self.rows: list[Sequence] = []  # in cache order
        self.cropped: list[Sequence] = []  # decoders whose context is full: no cache
        self.last: list[int] = []  # each cached row's token to feed at the next step

    @property
    def size(self) -> int:
        return len(self.rows) + len(self.cropped)


class Scheduler(Executor):
    """The decoding thread: continuous batching of `Sequence`s, and an executor of jobs."""

    def __init__(
        self,
        max_batch: int,
        on_first_token: Callable[[float], None] | None = None,
        block_size: int = 16,
        kv_blocks: int | None = None,
    ) -> None:
        self.max_batch = max_batch
        self.paged = PagedModels(max_batch, block_size, kv_blocks)
        self.on_first_token = on_first_token
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.jobs: collections.deque[tuple[Future, Callable, tuple]] = collections.deque()
        self.batches: dict[Hashable, _Batch] = {}
        self.cohorts = 0  # cohorts started, which name them apart
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.closed = False
        self.steps = 0  # decoding steps run, for the metrics
        self.tokens = 0  # tokens chosen
        self.running = 0  # rows decoding at the last step
        self.thread = threading.Thread(target=self._loop, name="attnkit-decode", daemon=True)
        self.thread.start()

    # -- the event loop's side --------------------------------------------

    def add(self, sequences: list[Sequence]) -> None:
        """Queue outputs to decode; their events come through their `emit`."""
        with self.lock:
            self.waiting.extend(sequences)
        self.wake.set()

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        """Run `fn(*args, **kwargs)` on the decoding thread, between two steps."""
        future: Future = Future()
        with self.lock:
            if self.closed:
                raise RuntimeError("the scheduler is closed")
            self.jobs.append((future, fn, (args, kwargs)))
        self.wake.set()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self.lock:
            self.closed = True
        self.wake.set()
        if wait:
            self.thread.join(timeout=30)

    @property
    def queued(self) -> int:
        """Outputs waiting to join a batch."""
        return len(self.waiting)

    # -- the decoding thread ------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self.lock:
                if self.closed:
                    break
                job = self.jobs.popleft() if self.jobs else None
                idle = not (self.waiting or self.jobs or job or self.batches)
            if idle:
                self.wake.wait()
                self.wake.clear()
                continue
            if job is not None:
                _run_job(*job)
            self._admit()
            for key in list(self.batches):
                self._advance(key)
            self.running = sum(b.size for b in self.batches.values())
        self._fail_all(RuntimeError("the decoding engine is closing"))

    def _admit(self) -> None:
        """Move waiting outputs into their model's batch, as far as `max_batch` allows."""
        with self.lock:
            busy: collections.Counter[int] = collections.Counter()
            for batch in self.batches.values():
                busy[id(batch.served)] += batch.size
            chosen: dict[Hashable, list[Sequence]] = {}
            kept: collections.deque[Sequence] = collections.deque()
            for sequence in self.waiting:
                model = id(sequence.model)
                if sequence.cancelled:
                    continue
                if busy[model] >= self.max_batch:
                    kept.append(sequence)
                    continue
                key = self._batch_key(sequence)
                if key[1] == "paged" and not self.paged.admit(sequence):
                    kept.append(sequence)  # it waits for blocks
                    continue
                busy[model] += 1
                chosen.setdefault(key, []).append(sequence)
            self.waiting = kept
            self.cohorts += 1
        for key, sequences in chosen.items():
            batch = self.batches.get(key)
            if batch is None:
                shared, paged = key[1] in ("shared", "paged"), key[1] == "paged"
                batch = self.batches[key] = _Batch(sequences[0].model, shared, paged)
            try:
                self._prefill(batch, sequences)
            except Exception as error:  # every output of the prefill hears it
                log.exception("the prefill of %d outputs failed", len(sequences))
                for sequence in sequences:
                    sequence.emit(Failed(sequence.index, error))
            for sequence in sequences if batch.paged else ():  # not joined: nothing promised
                if sequence not in batch.blocks:
                    self.paged.release(sequence)
            if not batch.size:
                del self.batches[key]

    def _batch_key(self, sequence: Sequence) -> Hashable:
        """The batch an output joins: its model's paged or shared batch, or a new cohort."""
        model = sequence.model.model
        if not cache_rows.joinable(model.config):
            return id(sequence.model), self.cohorts
        asked = sequence.config.cache_implementation
        paged = static_cache.chosen(asked, model.device) == "static"
        return id(sequence.model), "paged" if paged else "shared"

    @torch.no_grad()
    def _prefill(self, batch: _Batch, sequences: list[Sequence]) -> None:
        """Run the new outputs' prompts (or sources) once, choose their first tokens, and add
        the rows that go on to the running cache."""
        served = batch.served
        model, tokenizer = served.model, served.tokenizer
        ids, mask = pad([s.prompt for s in sequences], tokenizer.pad_id)
        ids, mask = ids.to(model.device), mask.to(model.device)
        # a shared batch grows its cache as it needs; a cohort's holds its rows to their end
        new = max(s.config.max_new_tokens for s in sequences)
        if model.config.shape == "encoder-decoder":
            capacity = 1 if batch.shared else min(1 + new, model.config.max_len)
            state = model.new_cache(ids, mask, capacity)
            cache, alignment = state.kv_cache, state.alignment
            start = torch.tensor([[s.config.decoder_start_token_id] for s in sequences])
            logits = _decode_step(model, start.to(model.device), cache, alignment)
        else:
            alignment = None
            ids, mask = left_pad(ids, mask)
            capacity = ids.shape[1] + (0 if batch.shared else new)
            cache = model.new_cache(ids, mask, min(capacity, model.config.max_len))
            logits = model.decode_step(ids, cache, mask)
        going = self._choose(sequences, logits)
        if not going:
            return
        keep = [i for i, s in enumerate(sequences) if s in going]
        if len(keep) < len(sequences):
            _keep_rows(cache, alignment, keep)
        if batch.paged:
            batch.memory = self.paged.memory(served, cache)
            batch.blocks.update(zip(going, batch.memory.add(cache), strict=True))
        elif batch.shared:
            caches = [cache] if batch.cache is None else [batch.cache, cache]
            cache = cache_rows.join(caches, model.config.max_len)
        if batch.memory is None:
            batch.cache, batch.alignment = cache, alignment
        batch.rows += going
        batch.last += [s.output[-1] for s in going]

    @torch.no_grad()
    def _advance(self, key: Hashable) -> None:
        """One decoding step of a batch's rows."""
        batch = self.batches[key]
        model = batch.served.model
        device = model.device
        try:
            self._crop_full_rows(batch, model)
            if batch.rows and batch.memory is not None:
                self._paged_step(batch)
            elif batch.rows:
                if batch.shared:
                    batch.cache = cache_rows.compact(batch.cache, model.config.max_len)
                last = torch.tensor(batch.last, device=device)[:, None]
                logits = _decode_step(model, last, batch.cache, batch.alignment)
                going = self._choose(batch.rows, logits)
                if len(going) < len(batch.rows):
                    keep = [i for i, s in enumerate(batch.rows) if s in going]
                    if keep:
                        _keep_rows(batch.cache, batch.alignment, keep)
                    batch.rows = going
                batch.last = [s.output[-1] for s in going]
                if not going:
                    batch.cache = None
            if batch.cropped:
                tails = [(s.prompt + s.output)[-model.config.max_len :] for s in batch.cropped]
                ids, mask = left_pad(*pad(tails, batch.served.tokenizer.pad_id))
                logits = model(ids.to(device), mask.to(device)).logits[:, -1]
                batch.cropped = self._choose(batch.cropped, logits)
        except Exception as error:
            log.exception("a decoding step failed")
            for sequence in batch.rows + batch.cropped:
                sequence.emit(Failed(sequence.index, error))
            for sequence, blocks in batch.blocks.items():  # the memory outlives the batch
                self.paged.leave(sequence, blocks)
            del self.batches[key]
            return
        if not batch.size:
            del self.batches[key]

    def _paged_step(self, batch: _Batch) -> None:
        """One step of a batch's rows on its paged memory; rows that end give their blocks back."""
        blocks = [batch.blocks[s] for s in batch.rows]
        logits = batch.memory.decode(blocks, batch.last)
        going = self._choose(batch.rows, logits)
        for sequence in set(batch.rows) - set(going):
            self.paged.leave(sequence, batch.blocks.pop(sequence))
        batch.rows, batch.last = going, [s.output[-1] for s in going]

    def _crop_full_rows(self, batch: _Batch, model: Any) -> None:
        """Rows whose context is full leave the cache: a decoder's go on cropped (each step
        reruns its last max_len tokens), an encoder-decoder's output ends (`length`). A
        cohort's rows all leave once its cache is full, the longest prompt's padding
        included: rerun whole, a shorter row's logits are those the cache would give."""
        if batch.memory is not None:
            full = [batch.blocks[s].length >= model.config.max_len for s in batch.rows]
            for sequence in [s for s, f in zip(batch.rows, full, strict=True) if f]:
                self.paged.leave(sequence, batch.blocks.pop(sequence))
        elif batch.cache is None:
            return
        else:
            full = (batch.cache.n_real >= model.config.max_len).tolist()
        if not batch.shared and batch.cache.length >= batch.cache.capacity:
            full = [True] * len(full)
        if not any(full):
            return
        keep = [i for i, f in enumerate(full) if not f]
        for i, f in enumerate(full):
            sequence = batch.rows[i]
            if f and model.config.shape == "decoder":
                batch.cropped.append(sequence)
            elif f:
                end(sequence, "length")
        batch.rows = [batch.rows[i] for i in keep]
        batch.last = [batch.last[i] for i in keep]
        if batch.memory is not None:
            return
        if keep:
            _keep_rows(batch.cache, batch.alignment, keep)
        else:
            batch.cache = None

    def _choose(self, sequences: list[Sequence], logits: torch.Tensor) -> list[Sequence]:
        """Each output's next token, its events sent; the outputs that go on. An output whose
        choice fails is failed alone and leaves; the others go on."""
        self.steps += 1
        choices = choose(logits, [s.row for s in sequences])
        going = []
        now = time.perf_counter()
        for sequence, choice in zip(sequences, choices, strict=True):
            if sequence.cancelled:
                continue
            if isinstance(choice, Exception):
                log.warning("choosing a token of one output failed: %s", choice)
                sequence.emit(Failed(sequence.index, choice))
                continue
            self.tokens += 1
            if sequence.first_token is None:
                sequence.first_token = now
                if self.on_first_token is not None:
                    self.on_first_token(now - sequence.arrived)
            try:
                goes = take(sequence, choice)
            except Exception as error:  # its text, say: this output alone fails
                log.warning("sending a token of one output failed: %s", error)
                sequence.emit(Failed(sequence.index, error))
                continue
            if goes:
                going.append(sequence)
        return going

    def _fail_all(self, error: Exception) -> None:
        with self.lock:
            waiting, self.waiting = list(self.waiting), collections.deque()
            jobs, self.jobs = list(self.jobs), collections.deque()
        for batch in self.batches.values():
            waiting += batch.rows + batch.cropped
        for sequence in waiting:
            sequence.emit(Failed(sequence.index, error))
        for future, _, _ in jobs:
            future.cancel()


def _decode_step(
    model: Any, ids: torch.Tensor, cache: KVCache, alignment: AlignmentState | None = None
) -> torch.Tensor:
    """`decode_step` on a served model's keys and values: an encoder-decoder's are its
    `DecodingState`'s whole but for the alignments of location-aware or monotonic attention,
    kept beside them (a served model copies nothing and has no monotonic window), so the rows
    are joined and compacted on the `KVCache` alone."""
    if model.config.shape == "encoder-decoder":
        return model.decode_step(ids, DecodingState(cache, alignment=alignment))
    return model.decode_step(ids, cache)


def _keep_rows(cache: KVCache, alignment: AlignmentState | None, keep: list[int]) -> None:
    """Keep the rows `keep` of a cache, in that order, and of the alignments beside it."""
    index = torch.tensor(keep, device=cache.kv.device)
    cache.reorder(index, memory=True)
    if alignment is not None:
        alignment.reorder(index)


def _run_job(future: Future, fn: Callable, arguments: tuple) -> None:
    if not future.set_running_or_notify_cancel():
        return
    args, kwargs = arguments
    try:
        future.set_result(fn(*args, **kwargs))
    except BaseException as error:  # the caller hears it
        future.set_exception(error)
