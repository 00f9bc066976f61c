"""Batching across requests: concurrent requests with the same options, one batch of work.

For the work that does not decode token by token on the scheduler (sentence
vectors, beam search, a pointer-generator's translations, attention views): one
loop runs the batches, one at a time, as jobs of the decoding thread
(`Scheduler.submit`, between two decoding steps). When work comes it waits
`wait_ms` for more, then takes the requests of the key (the model and every
option, so a batch computes alike) whose first item has waited longest, up to
`max_batch`, and runs them; what arrives meanwhile waits for the next batch. So batches grow
with the load: alone, a request waits `wait_ms`; under load, as many as came
during the last decode go together. Items whose request has gone (timed out,
disconnected) before their batch starts are dropped; a batch that has started
runs to its end. Decoding is padding-invariant, so a request's output does not
depend on its companions. A request that must decode alone (a seed, which must
draw for it only) runs all its items as one batch of its own (`run_alone`).

Work that may take long is a generator (`work.py`'s): each piece it yields, the
results of some of its items as (index, result) pairs, runs as a job of its own,
so the decoding steps of the streams under way go on between two pieces and a
stream waits one piece at most, however large the batch. A piece's items are
answered as it ends; once every request of a batch has gone, its later pieces
are not run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Generator, Hashable
from concurrent.futures import Executor
from typing import Any


class Batcher:
    """Gathers work items by key and runs each batch as `work(key, items) -> results`."""

    def __init__(
        self,
        work: Callable[[Hashable, list[Any]], list[Any]],
        wait_ms: float,
        max_batch: int,
        executor: Executor,
    ) -> None:
        self.work, self.wait, self.max_batch = work, wait_ms / 1000, max_batch
        self.executor = executor
        self.pending: dict[Hashable, list[tuple[Any, asyncio.Future]]] = {}  # oldest key first
        self.loop_task: asyncio.Task | None = None
        self.batches = 0  # decodes run, for the metrics
        self.items = 0  # work items they held

    async def submit(self, key: Hashable, item: Any) -> Any:
        """The result of `item`, once its batch has run."""
        future = asyncio.get_running_loop().create_future()
        self.pending.setdefault(key, []).append((item, future))
        if self.loop_task is None or self.loop_task.done():
            self.loop_task = asyncio.create_task(self._run_batches())
        return await future

    async def run_alone(self, key: Hashable, items: list[Any]) -> list[Any]:
        """The results of `items`, decoded as one batch of their own, at once."""
        self.batches += 1
        self.items += len(items)
        results: list[Any] = [None] * len(items)

        def answer(index: int, result: Any) -> None:
            results[index] = result

        await self._pieces(key, items, answer, lambda: False)
        return results

    async def _run_batches(self) -> None:
        """Batches, one after another, until no work is left."""
        while self.pending:
            if self.wait:
                await asyncio.sleep(self.wait)
            key = next(iter(self.pending))
            queue = self.pending.pop(key)
            if len(queue) > self.max_batch:  # the rest go first next time
                self.pending = {key: queue[self.max_batch :], **self.pending}
                queue = queue[: self.max_batch]
            queue = [(item, future) for item, future in queue if not future.done()]
            if queue:
                await self._run(key, queue)

    async def _run(self, key: Hashable, queue: list[tuple[Any, asyncio.Future]]) -> None:
        self.batches += 1
        self.items += len(queue)
        futures = [future for _, future in queue]

        def answer(index: int, result: Any) -> None:
            if not futures[index].done():  # else its request timed out or went away
                futures[index].set_result(result)

        try:
            await self._pieces(
                key, [item for item, _ in queue], answer, lambda: all(f.done() for f in futures)
            )
        except Exception as error:  # every request of the batch not yet answered hears it
            for future in futures:
                if not future.done():
                    future.set_exception(error)

    async def _pieces(
        self,
        key: Hashable,
        items: list[Any],
        answer: Callable[[int, Any], None],
        gone: Callable[[], bool],
    ) -> None:
        """Run `work(key, items)` on the executor and `answer` each item's result: a list
        at once, or a generator's pieces one job each, stopped early once `gone()`."""
        loop = asyncio.get_running_loop()
        done = await loop.run_in_executor(self.executor, self.work, key, items)
        if not isinstance(done, Generator):
            for index, result in enumerate(done):
                answer(index, result)
            return
        try:
            while not gone():
                piece = await loop.run_in_executor(self.executor, next, done, None)
                if piece is None:
                    break
                for index, result in piece:
                    answer(index, result)
        finally:
            # on the decoding thread, after the piece that may be running there
            with contextlib.suppress(RuntimeError):  # a scheduler shut down closes nothing
                self.executor.submit(done.close)

    def close(self) -> None:
        """Drop the work not started (at the server's shutdown)."""
        if self.loop_task is not None:
            self.loop_task.cancel()
