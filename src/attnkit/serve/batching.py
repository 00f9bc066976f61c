"""Batching across requests: concurrent requests with the same decoding options, one decode.

A request's work item waits up to `wait_ms` for others under the same key (the
model and every decoding option, so a batch decodes alike); the first of a key
starts the clock, and `max_batch` items flush at once. The batch runs on the
one decoding thread (torch uses its own threads inside it), and each request
gets back its own result, or the batch's error. Items whose request has gone
(timed out, disconnected) before their batch starts are dropped; a batch that
has started runs to its end. Decoding is padding-invariant, so a request's
output does not depend on its companions. A request that must decode alone
(a seed, which must draw for it only) runs all its items as one batch of its
own (`run_alone`). Streamed requests do not join batches: each streams from its
own decode on `stream_executor`, as its tokens must leave as they come.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class Batcher:
    """Gathers work items by key and runs each batch as `work(key, items) -> results`."""

    def __init__(
        self, work: Callable[[Hashable, list[Any]], list[Any]], wait_ms: float, max_batch: int
    ) -> None:
        self.work, self.wait, self.max_batch = work, wait_ms / 1000, max_batch
        # key -> (the queue's generation, its items and their futures)
        self.pending: dict[Hashable, tuple[int, list[tuple[Any, asyncio.Future]]]] = {}
        self.generations = itertools.count()
        self._executors()
        self.batches = 0  # decodes run, for the metrics
        self.items = 0  # work items they held

    async def submit(self, key: Hashable, item: Any) -> Any:
        """The result of `item`, once its batch has run."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        generation, queue = self.pending.setdefault(key, (next(self.generations), []))
        queue.append((item, future))
        if len(queue) >= self.max_batch or self.wait == 0:
            self._flush(key, generation)
        elif len(queue) == 1:
            loop.call_later(self.wait, self._flush, key, generation)
        return await future

    async def run_alone(self, key: Hashable, items: list[Any]) -> list[Any]:
        """The results of `items`, decoded as one batch of their own, at once."""
        self.batches += 1
        self.items += len(items)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self.work, key, items)

    def _flush(self, key: Hashable, generation: int) -> None:
        if self.pending.get(key, (None,))[0] != generation:  # flushed already, when it filled
            return
        _, queue = self.pending.pop(key)
        queue = [(item, future) for item, future in queue if not future.done()]
        if not queue:  # every request of it went away
            return
        self.batches += 1
        self.items += len(queue)
        items = [item for item, _ in queue]
        done = asyncio.get_running_loop().run_in_executor(self.executor, self.work, key, items)

        def hand_out(task: asyncio.Future) -> None:
            error = None if task.cancelled() else task.exception()
            results = [error] * len(queue) if error or task.cancelled() else task.result()
            for (_, future), result in zip(queue, results, strict=True):
                if future.done():  # its request timed out or went away
                    continue
                if error is not None:
                    future.set_exception(result)
                elif task.cancelled():
                    future.cancel()
                else:
                    future.set_result(result)

        done.add_done_callback(hand_out)

    def _executors(self) -> None:
        # threads start only when work comes, so fresh executors cost nothing until used
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnkit-decode")
        self.stream_executor = ThreadPoolExecutor(
            max_workers=4, thread_name_prefix="attnkit-stream"
        )

    def close(self) -> None:
        """Drop the work not started (at the server's shutdown); a later request starts anew."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.stream_executor.shutdown(wait=False, cancel_futures=True)
        self._executors()
