"""Reading text files: the lines of UTF-8 text, from plain or gzipped (`.gz`) files.

The one reader under the tokenizer's training and every data reader. Bad input
stops with the file and line at fault: a missing file, invalid UTF-8, a
truncated or corrupt `.gz`.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from attnkit.errors import AttnkitError

PathLike = str | Path


def read_lines(path: PathLike, *, keepends: bool = False) -> Iterator[str]:
    """Yield the lines of a UTF-8 text file (gzipped if it ends in `.gz`).

    Line endings are removed unless `keepends`, which a language model wants
    because a newline is part of its token stream.
    """
    path = Path(path)
    with _open_binary(path) as stream:
        number = 0
        try:
            for number, raw in enumerate(stream, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise AttnkitError(
                        f"{path} line {number} is not valid UTF-8 (byte {err.start} of the line); "
                        "re-encode the file as UTF-8"
                    ) from None
                yield line if keepends else line.rstrip("\r\n")
        except (OSError, EOFError, zlib.error) as err:
            # A truncated or corrupt .gz surfaces only while reading.
            raise AttnkitError(
                f"{path} could not be read after line {number} ({err}); replace the file"
            ) from None


def _open_binary(path: Path) -> IO[bytes]:
    if not path.is_file():
        raise AttnkitError(f"no text file at {path}; check the path")
    return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")
