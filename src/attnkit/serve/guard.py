"""What stands before the routes: the API key, the count of requests in flight, the metrics,
and every error as JSON in OpenAI's shape, `{"error": {"message", "type", "code"}}`.

Statuses: 400 a request the server cannot do (a wrong model, an input too long,
a body that is not JSON), 401 a missing or wrong API key, 404 an unknown model or
path, 405 a wrong method, 422 a field of the wrong type, 429 too many requests in
flight, 504 a result slower than `timeout_s`, 500 a fault of the server itself
(logged, said in one sentence, never a traceback). A request counts as in flight
until the last byte of its answer is sent, so a stream holds its place while it
streams.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from attnkit.errors import AttnkitError
from attnkit.serve.metrics import Metrics
from attnkit.serve.settings import ServeSettings

log = logging.getLogger(__name__)


class ServeError(Exception):
    """A request refused with `status` and one sentence."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def error_response(error: ServeError) -> JSONResponse:
    body = {"error": {"message": error.message, "type": error.kind, "code": error.status}}
    return JSONResponse(body, status_code=error.status)


class Guard:
    """An ASGI middleware (not Starlette's `BaseHTTPMiddleware`, whose streamed answers end for
    it before their last byte): it returns when the whole answer is sent, so a stream holds
    its place until it ends."""

    def __init__(self, app: Any, app_state: Any, settings: ServeSettings, metrics: Metrics) -> None:
        self.app, self.state, self.settings, self.metrics = app, app_state, settings, metrics
        self.expected = None if settings.api_key is None else f"Bearer {settings.api_key}"
        self.paths: set[str] | None = None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, path = time.perf_counter(), self._label(scope)
        refusal = self._refusal(scope)
        if refusal is not None:
            self.metrics.count(path, refusal.status, 0.0)
            await error_response(refusal)(scope, receive, send)
            return
        status = 500

        async def sending(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.state.in_flight += 1
        try:
            await self.app(scope, receive, sending)
        finally:  # the whole answer is out, or the client went away
            self.state.in_flight -= 1
            self.metrics.count(path, status, time.perf_counter() - started)

    def _refusal(self, scope: dict) -> ServeError | None:
        headers = dict(scope.get("headers") or [])
        sent = headers.get(b"authorization", b"").decode("latin-1")
        keyed = scope["path"].startswith("/v1/") and self.expected is not None
        if keyed and not secrets.compare_digest(sent, self.expected):
            message = "a valid API key is needed: Authorization: Bearer <key>."
            return ServeError(401, message, "authentication_error")
        if self.state.in_flight >= self.settings.max_concurrent:
            n = self.settings.max_concurrent
            return ServeError(
                429, f"the server has {n} requests in flight; try again.", "rate_limit_error"
            )
        return None

    def _label(self, scope: dict) -> str:
        """A metrics label: the path of one of the server's routes, or `other`, so that a
        client cannot make new series or break the format."""
        if self.paths is None:
            self.paths = {getattr(r, "path", None) for r in scope["app"].routes}
        return scope["path"] if scope["path"] in self.paths else "other"


def add_guard(app: FastAPI, settings: ServeSettings, metrics: Metrics) -> None:
    """The key check, the in-flight limit and count, the metrics, and the error handlers."""
    app.state.in_flight = 0

    app.add_middleware(Guard, app_state=app.state, settings=settings, metrics=metrics)

    @app.exception_handler(ServeError)
    async def refused(request: Request, error: ServeError) -> JSONResponse:
        return error_response(error)

    @app.exception_handler(AttnkitError)
    async def bad_input(request: Request, error: AttnkitError) -> JSONResponse:
        return error_response(ServeError(400, str(error)))

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0]
        if first["type"] == "json_invalid":
            return error_response(ServeError(400, "the request body is not valid JSON."))
        where = ".".join(str(x) for x in first["loc"] if x != "body")
        return error_response(ServeError(422, f"{where or 'the body'}: {first['msg']}."))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return error_response(ServeError(error.status_code, f"{error.detail}.", kind))

    @app.exception_handler(Exception)
    async def fault(request: Request, error: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        message = f"the server failed on this request ({type(error).__name__}: {error})."
        return error_response(ServeError(500, message, "server_error"))
