"""What stands before the routes: the request id, the body's size, the API key, the count of
requests in flight, the metrics and the access log.

Every answer carries `X-Request-ID` (the client's, when it sends a sane one, else a
new one), which the access log line names:

    INFO attnkit.access: 2026-11-28T19:40:12.345Z 127.0.0.1 "POST /v1/completions" 200 0.412 s
                         id=4f0c...

(one line; the time the request ended, in UTC, whatever the logging's own format shows).

A body whose Content-Length is over `max_body_bytes` is answered 413 before a
byte of it is read; one sent without a length is cut off with 413 as soon as it
outgrows the limit. Only /v1 requests need the key and count as in flight:
`/health`, `/ready`, `/metrics` and the page answer however busy the server is.
A request counts until the last byte of its answer is sent, so a stream holds its
place while it streams; one over `max_concurrent` is answered 429 with Retry-After.
A /v1 body that has not come whole within `body_timeout_s` is answered 408.
A /v1 request whose client goes away before its answer begins is cancelled there
(its outputs leave the batch, its batch work stops), logged with status 499.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import re
import secrets
import time
import uuid
from collections.abc import Callable
from typing import Any

import anyio
from starlette.exceptions import HTTPException

from attnkit.serve.errors import ServeError
from attnkit.serve.server import ARRIVED, REQUEST_NOTES, Server

access = logging.getLogger("attnkit.access")

_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")  # printable ASCII, no spaces
RETRY_AFTER_S = 1
CLIENT_GONE = 499  # nginx's status for a request whose client closed it: no answer was sent


class Guard:
    """An ASGI middleware (not Starlette's `BaseHTTPMiddleware`, whose streamed answers end for
    it before their last byte): it returns when the whole answer is sent."""

    def __init__(self, app: Any, server: Server, paths: set[str]) -> None:
        self.app, self.server, self.paths = app, server, paths
        key = server.settings.api_key
        # compared as bytes: a header may hold any byte, which a str comparison refuses
        self.expected = None if key is None else f"Bearer {key}".encode()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = scope[ARRIVED] = time.perf_counter()
        headers = dict(scope.get("headers") or [])
        sent_id = headers.get(b"x-request-id", b"").decode("latin-1")
        request_id = sent_id if _REQUEST_ID.fullmatch(sent_id) else uuid.uuid4().hex
        status = 500

        async def sending(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", request_id.encode())]
            await send(message)

        notes: dict[str, str] = {}
        REQUEST_NOTES.set(notes)  # the app's task copies this context: its notes come here
        api = scope["path"].startswith("/v1/")
        refusal = self._refusal(scope, headers, api)
        try:
            if refusal is not None:
                await refusal.response()(scope, receive, sending)
                return
            if not api:
                await self.app(scope, receive, sending)
                return
            self.server.in_flight += 1
            try:
                if await self._until_gone(scope, self._limited(receive, started), sending):
                    status = CLIENT_GONE
            finally:  # the whole answer is out, or the client went away
                self.server.in_flight -= 1
        finally:
            seconds = time.perf_counter() - started
            self.server.metrics.count(self._label(scope), status, seconds, notes.get("model", ""))
            if self.server.settings.access_log:
                client = (scope.get("client") or ("-",))[0]
                now = datetime.datetime.now(datetime.timezone.utc)
                when = now.isoformat(timespec="milliseconds").replace("+00:00", "Z")
                access.info('%s %s "%s %s" %d %.3f s id=%s', when, client, scope["method"],
                            scope["path"], status, seconds, request_id)  # fmt: skip

    async def _until_gone(self, scope: dict, receive: Callable, send: Callable) -> bool:
        """Run the app on a request; if its client goes away before the answer begins, cancel
        it (its outputs leave the batch, its batch work stops) and say so. A stream, once it
        has begun, hears its client go by itself (Starlette's `StreamingResponse`)."""
        body_read = asyncio.Event()

        async def receiving() -> dict:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_read.set()
            return message

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                watcher.cancel()
            await send(message)

        async def watch() -> None:
            await body_read.wait()  # the app has the body: what comes next is the end
            while (await receive())["type"] != "http.disconnect":
                pass

        app = asyncio.ensure_future(self.app(scope, receiving, sending))
        watcher = asyncio.ensure_future(watch())
        try:
            await asyncio.wait({app, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if watcher.cancelled():  # the answer has begun: the app sends it whole
                await app
        finally:
            watcher.cancel()
            if not app.done():  # the client has gone (or the server is stopping us)
                app.cancel()
                # waits for its end without raising its CancelledError, so that a cancel of
                # this task itself (the server stopping) still goes through
                await asyncio.wait({app})
        if app.cancelled():
            return True
        app.result()  # the app's own failure, raised here as it was before
        return False

    def _refusal(self, scope: dict, headers: dict, api: bool) -> ServeError | None:
        settings = self.server.settings
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > settings.max_body_bytes:
            return _too_large(settings.max_body_bytes)
        sent = headers.get(b"authorization", b"")
        if api and self.expected is not None and not secrets.compare_digest(sent, self.expected):
            message = "a valid API key is needed: Authorization: Bearer <key>."
            return ServeError(401, message, code="invalid_api_key")
        if api and self.server.in_flight >= settings.max_concurrent:
            n = settings.max_concurrent
            return ServeError(
                429,
                f"the server has {n} requests in flight; try again.",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        return None

    def _limited(self, receive: Callable, started: float) -> Callable:
        """`receive`, stopped with 413 once the body outgrows the limit (a body sent without a
        Content-Length, chunk by chunk), and with 408 when the whole body has not come within
        `body_timeout_s` of the request's arrival (a client dribbling bytes holds no place)."""
        settings = self.server.settings
        limit, read, complete = settings.max_body_bytes, 0, False
        deadline = started + settings.body_timeout_s

        async def receiving() -> dict:
            nonlocal read, complete
            if complete:  # after the body: the end of the request, however long it takes
                return await receive()
            try:
                with anyio.fail_after(deadline - time.perf_counter()):
                    message = await receive()
            except TimeoutError:
                raise HTTPException(
                    408,
                    f"the request body did not arrive within {settings.body_timeout_s:g} s; "
                    "send it whole, or start the server with a larger --body-timeout",
                ) from None
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > limit:
                    raise HTTPException(413, _too_large(limit).message.rstrip("."))
                complete = not message.get("more_body", False)
            else:
                complete = True
            return message

        return receiving

    def _label(self, scope: dict) -> str:
        """A metrics label: the path of the route that answered (or would have), else `other`,
        so that a client cannot make new series or break the format."""
        route = scope.get("route")
        if route is not None:
            return getattr(route, "path", "other")
        return scope["path"] if scope["path"] in self.paths else "other"


def _too_large(limit: int) -> ServeError:
    return ServeError(
        413,
        f"the request body is over the server's limit of {limit:,} bytes; send less, or "
        "start the server with a larger --max-body-bytes.",
        code="request_too_large",
    )
