"""The web page of `attnkit serve`, served by the same process and working offline.

`/` is one hand-written page (`page/index.html`, `page/app.js`, `page/style.css`,
no library, no build step, nothing fetched from elsewhere): pick a model, type a
text, choose the decoding, and watch the translation or continuation stream in;
then look inside: every attention of the text just run, layer by layer and head
by head, as lines between tokens (bertviz's head view: hover a token to keep
only its lines) and as a heat map; and the sinusoidal positional encoding
(`/positional.png`, drawn by `attnkit.viz`).
"""

from __future__ import annotations

import functools
import tempfile
import threading
from pathlib import Path

from fastapi import FastAPI, Query
from fastapi.responses import FileResponse, Response

PAGE = Path(__file__).with_name("page")
FILES = {"app.js": "text/javascript", "style.css": "text/css"}


def add_page(app: FastAPI) -> None:
    """The page's routes: `/`, its two static files, and the positional encoding's picture."""

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(PAGE / "index.html", media_type="text/html")

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in FILES:
            return Response(status_code=404)
        return FileResponse(PAGE / name, media_type=FILES[name])

    @app.get("/positional.png", include_in_schema=False)
    def positional(
        d_model: int = Query(128, ge=8, le=1024), length: int = Query(100, ge=8, le=2000)
    ) -> Response:
        return Response(_positional_png(d_model - d_model % 2, length), media_type="image/png")


_DRAWING = threading.Lock()  # pyplot's state is global: one picture at a time


@functools.lru_cache(maxsize=8)
def _positional_png(d_model: int, length: int) -> bytes:
    """The picture of the positional encoding, drawn once for each size asked."""
    from attnkit.viz import plot_positional_encoding

    with _DRAWING, tempfile.TemporaryDirectory() as tmp:
        return plot_positional_encoding(Path(tmp) / "pe.png", d_model, length).read_bytes()
