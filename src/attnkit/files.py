"""Files: reading the lines of UTF-8 text files, and writing any file atomically.

`read_lines` is the one reader under the tokenizer's training and every data
reader, for plain or gzipped (`.gz`) files. Bad input stops with the file and
line at fault: a missing file, invalid UTF-8, a truncated or corrupt `.gz`.

`atomic_write` writes every file attnkit saves (run folders, tokenizers,
checkpoints) to a temporary name and renames it, so a crash mid-write never
leaves a half-written file behind.
"""

from __future__ import annotations

import gzip
import os
import tempfile
import zlib
from collections.abc import Callable, Iterator
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


def atomic_write(path: PathLike, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` on a temporary file beside `path`, then rename it to `path`.

    The rename is atomic on POSIX, so readers see the old file or the new one,
    never a partial one; if `write` raises, the old file is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
