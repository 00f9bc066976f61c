"""The app of `attnkit serve`: a `Server` (the models, the scheduler, the metrics) behind the
routers, the guard, CORS and the error handlers.

Requests and responses follow OpenAI's API where it has the endpoint, so its
clients work unchanged (`routes.py`); `/v1/translate` and `/v1/attention` are
attnkit's (`translate.py`); the page is `page.py`'s; `/openapi.json` is the schema
of them all and `/docs` its page. At shutdown (SIGTERM, Ctrl-C) uvicorn stops
taking connections and lets the requests in flight end, streams included; then
the decoding thread stops (the app's `lifespan`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import AsyncIterator, Sequence

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from attnkit.serve.errors import add_error_handlers
from attnkit.serve.guard import Guard
from attnkit.serve.page import add_page
from attnkit.serve.routes import openai, operations
from attnkit.serve.runs import Served
from attnkit.serve.server import Server
from attnkit.serve.settings import ServeSettings
from attnkit.serve.translate import router as translation


def _version() -> str:
    """attnkit's installed version, for the schema ("unknown" from a source tree)."""
    try:
        return importlib.metadata.version("attnkit")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def create_app(served: Sequence[Served], settings: ServeSettings | None = None) -> FastAPI:
    """The server of `served` models, by name, with `settings`' limits."""
    server = Server(served, settings or ServeSettings())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        server.close()  # after the requests in flight have ended: the decoding thread stops

    app = FastAPI(
        title="attnkit",
        summary="OpenAI's completions, chat and embeddings, and attnkit's translations and "
        "attention views, for the run folders it serves.",
        version=_version(),
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.server = server
    routers = (operations, openai, translation)
    for router in routers:
        app.include_router(router)
    add_page(app)
    add_error_handlers(app)
    paths = {route.path for router in routers for route in router.routes}
    paths |= {"/docs", "/openapi.json"}
    app.add_middleware(Guard, server=server, paths=paths)
    if server.settings.cors_origins:  # outermost: a browser's preflight needs no key
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(server.settings.cors_origins),
            allow_methods=["GET", "POST"],
            # any header the page's client asks for: OpenAI's JavaScript client sends its
            # x-stainless-* headers (its version, runtime, retries), which a list would refuse
            allow_headers=["*"],
            expose_headers=["X-Request-ID", "Retry-After"],
        )
    return app
