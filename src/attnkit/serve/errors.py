"""Every refusal and fault as JSON in OpenAI's shape, so its clients raise their own exceptions:

    {"error": {"message": "...", "type": "invalid_request_error", "param": "stop",
               "code": "invalid_value"}}

`message` is one sentence; `param` names the request's field at fault (None
when none is); `code` is a string or None. Statuses: 400 a request the server
cannot do (a field's value, an unknown or unsupported parameter, a body that is
not JSON, a model of the wrong shape), 401 a missing or wrong API key, 404 an
unknown model or path, 405 a wrong method, 408 a body slower than `body_timeout_s`,
413 a body over `max_body_bytes`, 429
too many requests in flight (with Retry-After), 503 a server shutting down, 504 a
result slower than `timeout_s`, 500 a fault of the server itself (logged, said in
one sentence, never a traceback).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from attnkit.errors import AttnkitError

log = logging.getLogger(__name__)

_TYPES = {
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
    504: "timeout",
    500: "server_error",
}


class ServeError(Exception):
    """A request refused with `status`, one sentence, the field at fault and a code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers

    def body(self) -> dict:
        kind = _TYPES.get(self.status, "invalid_request_error")
        error = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        return {"error": error}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(param: str, message: str, code: str = "invalid_value") -> ServeError:
    """A 400 for the value of the field `param`."""
    return ServeError(400, message, param=param, code=code)


def add_error_handlers(app: FastAPI) -> None:
    """Each kind of failure an endpoint can meet, answered in OpenAI's shape."""

    @app.exception_handler(ServeError)
    async def refused(request: Request, error: ServeError) -> JSONResponse:
        return error.response()

    @app.exception_handler(AttnkitError)
    async def bad_input(request: Request, error: AttnkitError) -> JSONResponse:
        return ServeError(400, str(error)).response()

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, error: RequestValidationError) -> JSONResponse:
        return validation_error(error.errors()).response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 408: "request_timeout",
                413: "request_too_large"}  # fmt: skip
        message = str(error.detail).rstrip(".") + "."
        return ServeError(error.status_code, message, code=code.get(error.status_code)).response()

    @app.exception_handler(Exception)
    async def fault(request: Request, error: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        # the kind of failure only: its text may name the server's files, which its log keeps
        message = f"the server failed on this request ({type(error).__name__}); its log says more."
        return ServeError(500, message, code="internal_error").response()


def validation_error(errors: list[dict]) -> ServeError:
    """The first of pydantic's complaints about a body, as one sentence naming its field."""
    first = errors[0]
    if first["type"] == "json_invalid":
        return ServeError(400, "the request body is not valid JSON.", code="invalid_json")
    where = [str(x) for x in first["loc"] if x != "body"]
    # a union's failed branches add their type names (`str`, `list[int]`) to the place
    where = [x for x in where if not _is_branch(x)]
    param = ".".join(where) or None
    if first["type"] == "extra_forbidden":
        return ServeError(
            400,
            f"unrecognized request argument supplied: {param}.",
            param=param,
            code="unknown_parameter",
        )
    if first["type"] == "missing":
        return ServeError(
            400, f"{param} is required.", param=param, code="missing_required_parameter"
        )
    message = str(first["msg"]).removeprefix("Value error, ").rstrip(".")
    return ServeError(400, f"{param or 'the body'}: {message}.", param=param, code="invalid_value")


def _is_branch(part: str) -> bool:
    return part in {"str", "int", "float", "bool"} or part.startswith(("list[", "function-"))
