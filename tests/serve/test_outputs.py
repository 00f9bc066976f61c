"""A request's outputs and its batch work, as the event loop sees them: a cancel is never lost."""

from __future__ import annotations

import asyncio

import pytest

from attnkit.generation import GenerationConfig
from attnkit.generation.rows import Piece, Sequence
from attnkit.serve.app import create_app
from attnkit.serve.outputs import Outputs
from attnkit.serve.runs import Served


class Holding:
    """A scheduler that only keeps the outputs it is given: the test plays its events."""

    def add(self, sequences: list[Sequence]) -> None:
        self.sequences = sequences


@pytest.mark.parametrize("stream", [False, True])
def test_a_cancel_that_comes_with_an_event_stops_the_request(
    served: list[Served], stream: bool
) -> None:
    """The client goes in the very step a token comes: the request must still end, cancelled,
    and its outputs leave the batch, at once. (`asyncio.wait_for` on Python 3.11 returned the token
    and dropped the cancel, CPython gh-86296, or held it until every output had ended: the
    request decoded on to its end.)"""

    async def main() -> None:
        scheduler = Holding()
        outputs = Outputs(scheduler, served[0], [[1, 2]], GenerationConfig(max_new_tokens=4))

        async def read() -> None:
            if stream:
                async for _ in outputs.events(timeout_s=10):
                    pass
            else:
                await outputs.collect(timeout_s=10)

        task = asyncio.ensure_future(read())
        for _ in range(5):  # the request is waiting for its first token
            await asyncio.sleep(0)
        outputs.queue.put_nowait(Piece(0, "a", []))
        task.cancel()  # in the same step as the token
        for _ in range(5):  # no more tokens come: a lost cancel would wait for them
            await asyncio.sleep(0)
        assert task.cancelled()
        assert all(sequence.cancelled for sequence in scheduler.sequences)  # they leave the batch

    asyncio.run(main())


def test_a_cancel_that_comes_with_a_batch_result_stops_the_request(served: list[Served]) -> None:
    """The same for work the batcher runs (embeddings, a translation's beam): the client goes in
    the step its result comes, and the request still ends cancelled, at once."""
    server = create_app(served).state.server
    real = server.batcher

    class Answering:  # a batcher whose results the test plays
        def submit(self, key: object, item: object) -> asyncio.Future:
            self.result = asyncio.get_running_loop().create_future()
            return self.result

    async def main() -> None:
        server.batcher = batcher = Answering()
        task = asyncio.ensure_future(server.run(("work",), ["item"]))
        for _ in range(5):  # the request is waiting for its result
            await asyncio.sleep(0)
        batcher.result.set_result("done")
        await asyncio.sleep(0)  # the results are gathered in this step ...
        task.cancel()  # ... and the client goes in it
        for _ in range(5):
            await asyncio.sleep(0)
        assert task.cancelled()

    try:
        asyncio.run(main())
    finally:  # the real batcher back, so that close() stops its thread
        server.batcher = real
        server.close()
