"""The web page of `attnkit serve`, served by the same process and working offline.

`/` is one hand-written page (`page/index.html`, `page/app.js`, `page/style.css`,
no library, no build step, nothing fetched from elsewhere), laid out for a
desktop and for a 390-pixel phone: pick a model, type a text, choose the
decoding (only the controls that apply to the model show), and watch the
translation or continuation stream in; then look inside: every attention of the
text just run, layer by layer and head by head, as lines between tokens (bertviz's
head view: hover or tap a token to keep only its lines) and as a heat map with
its axes named and its colour scale; and the positions picture of the model's own
method (`/positions.png?model=NAME`, drawn by `attnkit.viz.plot_model_positions`).
"""

from __future__ import annotations

import functools
import tempfile
import threading
from pathlib import Path

from fastapi import FastAPI, Query
from fastapi.responses import FileResponse, Response

from attnkit.serve.runs import Served
from attnkit.serve.server import ServerDep

PAGE = Path(__file__).with_name("page")
FILES = {"app.js": "text/javascript", "style.css": "text/css"}
ICON = PAGE / "favicon.svg"


def add_page(app: FastAPI) -> None:
    """The page's routes: `/`, its static files, its icon and the positions picture."""

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(PAGE / "index.html", media_type="text/html")

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in FILES:
            return Response(status_code=404)
        return FileResponse(PAGE / name, media_type=FILES[name])

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        return FileResponse(ICON, media_type="image/svg+xml")

    @app.get("/positions.png", include_in_schema=False)
    def positions(srv: ServerDep, model: str = Query(..., max_length=128)) -> Response:
        served = srv.model(model, None, "/positions.png")
        return Response(_positions_png(served), media_type="image/png")


_DRAWING = threading.Lock()  # pyplot's state is global: one picture at a time


@functools.lru_cache(maxsize=16)
def _positions_png(served: Served) -> bytes:
    """The picture of a served model's positions, drawn once."""
    from attnkit.viz import plot_model_positions

    with _DRAWING, tempfile.TemporaryDirectory() as tmp:
        return plot_model_positions(served.model, Path(tmp) / "positions.png").read_bytes()
