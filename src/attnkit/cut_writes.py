"""What a write cut short leaves: the temporary files of a save killed halfway.

`attnkit.files.atomic_write` writes each file under a hidden temporary name and renames it
into place, and `replace_folder` stages a folder the same way; a process killed mid-write
leaves that temporary behind. The run folder counts such leftovers as its own, a new start
or a resume removes them (`attnkit.train.new_run`, `attnkit.train.checkpoint`), and nothing
else of a user's is taken for one.
"""

from __future__ import annotations

import re
from pathlib import Path

# `atomic_write` writes NAME through `.NAME.XXXXXXXX.tmp` beside it (mkstemp's eight letters,
# digits and underscores); a process killed mid-write leaves that file behind.
_PARTIAL = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp")


# A library may stage its own save as well: safetensors (0.8 here) writes through Rust's
# `tempfile`, `.tmpXXXXXX` (six letters and digits) beside the file, and renames it onto the
# file, so a kill inside `atomic_write` of weights can leave that file beside ours.
_LIBRARY_PARTIAL = re.compile(r"\.tmp[A-Za-z0-9]{6}")


def library_partial(path: Path) -> bool:
    """Whether `path` is the staging file of a safetensors save cut short: by its name, and by
    its bytes so far: none, or those of a safetensors file (the header's 8-byte length, then
    `{`), so that a user's file of that name is not taken for one. A kill in the instant
    between the length and the header leaves 8 bytes, not recognised: the next start names
    the file rather than remove it."""
    if _LIBRARY_PARTIAL.fullmatch(path.name) is None or path.is_symlink() or not path.is_file():
        return False
    with path.open("rb") as handle:
        start = handle.read(9)
    return start == b"" or start[8:9] == b"{"


def is_partial(path: Path) -> bool:
    """Whether `path` is what a write cut short leaves: the hidden `.tmp` file or folder of
    `atomic_write` or `replace_folder`, or the staging file of a safetensors save."""
    ours = path.name.startswith(".") and path.name.endswith(".tmp")
    return ours or library_partial(path)


def partial_of(path: Path) -> Path | None:
    """The file whose `atomic_write` was cut short leaving `path`, or None if `path` is no such."""
    found = _PARTIAL.fullmatch(path.name)
    return None if found is None else path.with_name(found["name"])
