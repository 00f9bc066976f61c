"""Files: UTF-8 text read, any file written atomically (over 400 lines: every way a path fails).

Reading the lines of UTF-8 text, and writing any file atomically.

`read_lines` is the one reader under the tokenizer's training and every data
reader, for plain or gzipped (`.gz`) files. Bad input stops with the file and
line at fault: a missing file, invalid UTF-8, a truncated or corrupt `.gz`. A
byte-order mark before the first line (Windows editors write one) is dropped.
`decode_lines` reads standard input the same way, and `check_utf8` checks text
that arrives as a string (a command-line argument). Running text (a language
model's corpus, a tokenizer's training text) is read with `pieces`: a line longer
than `PIECE_BYTES` comes in pieces cut before a space between words (at a
character otherwise), so memory stays bounded on a corpus in one line (text8's
shape) while the pieces, joined, are the line.

`check_writable` tells, before any work, whether an output path can be written, by
a real write in its `nearest_folder`, and refuses an output that is one of the
command's own inputs (`same_file`: the same file under another name, through a
link, or as standard input), which writing would destroy.

`atomic_write` writes every file attnkit saves (run folders, tokenizers,
checkpoints) to a temporary name and renames it, so a crash mid-write never
leaves a half-written file behind; `append_line` adds a whole line or none, and
`replace_folder` fills a folder only once everything for it is written. A
write that finds no room (disk full, quota, file too large) stops with
`WriteError`: the file, the reason, and what is intact. Only a regular file is
replaced by renaming: a symbolic link's target is what gets replaced (the link
stays), and a device, a FIFO or a socket (/dev/stdout, /dev/null, a named pipe)
is written in place, since renaming over it would put a regular file where the
system's device was.
"""

from __future__ import annotations

import errno
import gzip
import os
import re
import shutil
import stat
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

from attnkit.errors import AttnkitError

PathLike = str | Path


# The most bytes of a line read at once when reading `pieces` of running text: small enough
# that a corpus in one line costs no more memory than one in short lines, large enough that
# a piece holds thousands of words.
PIECE_BYTES = 1 << 12
_SPACES = frozenset(b" \t\r\n\x0b\x0c")


def read_lines(path: PathLike, *, keepends: bool = False, pieces: bool = False) -> Iterator[str]:
    """Yield the lines of a UTF-8 text file (gzipped if it ends in `.gz`).

    Line endings are removed unless `keepends`, which a language model wants
    because a newline is part of its token stream. With `pieces`, a line longer
    than `PIECE_BYTES` is yielded in pieces (`decode_lines`).
    """
    path = Path(path)
    with open_binary(path) as stream:
        yield from decode_lines(stream, str(path), keepends=keepends, pieces=pieces)


def decode_lines(
    stream: Iterable[bytes], name: str, *, keepends: bool = False, pieces: bool = False
) -> Iterator[str]:
    """Yield the lines of a binary stream (an open file, `sys.stdin.buffer`) as UTF-8 text.

    `name` says in errors where the lines come from: a path, "standard input".
    With `pieces` (a stream with `readline`), a line longer than `PIECE_BYTES` is
    read and yielded a piece at a time, each cut before a single space between
    two words, so that a tokenizer that splits at spaces encodes the pieces as it
    would the line (a piece with no such space is cut between two characters).
    """
    number, at = 0, 0  # the line being read, and the byte of it where the next piece starts
    try:
        raws = _pieces(stream) if pieces else ((raw, True) for raw in stream)  # type: ignore[arg-type]
        for raw, ends in raws:
            number += at == 0
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise AttnkitError(
                    f"{name} line {number} is not valid UTF-8 (byte {at + err.start} of the "
                    "line); re-encode it as UTF-8"
                ) from None
            if number == 1 and at == 0:  # a byte-order mark some editors put first is no text
                line = line.removeprefix("\ufeff")
            at = 0 if ends else at + len(raw)
            yield line if keepends or not ends else line.rstrip("\r\n")
    except (OSError, EOFError, zlib.error) as err:
        # A truncated or corrupt .gz surfaces only while reading.
        raise AttnkitError(
            f"{name} could not be read after line {number} ({err}); replace the file"
        ) from None


def _pieces(stream: IO[bytes]) -> Iterator[tuple[bytes, bool]]:
    """The lines of `stream` in pieces of about `PIECE_BYTES`, each with whether it ends
    its line."""
    carry = b""
    while raw := carry + (more := stream.readline(PIECE_BYTES)):
        # readline stops short of its limit only at a newline or at the end of the stream.
        if raw.endswith(b"\n") or len(more) < PIECE_BYTES:
            carry = b""
            yield raw, True
        else:
            cut = _cut(raw)
            carry = raw[cut:]
            yield raw[:cut], False


def _cut(raw: bytes) -> int:
    """Where to cut a piece off `raw`: before the last single space between two words in its
    second half, else before the last character that starts in its last 4 bytes."""
    half = len(raw) // 2
    at = raw.rfind(b" ", half, len(raw) - 1)
    while at > half:
        if raw[at - 1] not in _SPACES and raw[at + 1] not in _SPACES:
            return at
        at = raw.rfind(b" ", half, at)
    for at in range(len(raw) - 1, len(raw) - 5, -1):
        if raw[at] & 0xC0 != 0x80:  # not a UTF-8 continuation byte: a character starts here
            return at
    return len(raw)  # not UTF-8: decoding the piece says where


def check_utf8(text: str, what: str) -> str:
    """`text` if it can be written as UTF-8; else stop, naming `what` it is.

    Python keeps the bytes of a command-line argument that are not UTF-8 as lone
    surrogates, which no tokenizer can encode.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise AttnkitError(
            f"{what} is not valid UTF-8 (character {err.start}); re-encode it as UTF-8"
        ) from None
    return text


def check_writable(
    path: PathLike,
    what: str,
    *,
    inputs: Iterable[tuple[str, PathLike | None]] = (),
    stdin: bool = False,
) -> Path:
    """Stop before any work when no file can be written at `path` (missing folders would be
    made): it is a folder, a file stands where a folder should, or its folder refuses; or
    when `path` is one of the command's `inputs` (each a name for the user and a path) or,
    with `stdin`, the file standard input reads: writing would replace what is being read.

    `what` names the path for the user, e.g. "--output".
    """
    path = Path(path)
    for name, source in inputs:
        if source is not None and (same_file(path, source) or _same_name(path, source)):
            _refuse_input(what, path, name)
    if stdin and _is_stdin(path):
        _refuse_input(what, path, "standard input")
    if path.is_dir():
        raise AttnkitError(f"{what} {path} is a folder; give a file path")
    if path.exists() and not path.is_file():
        # A device or pipe (/dev/stdout) is written in place, so only its own bits count.
        if not os.access(path, os.W_OK):
            raise AttnkitError(f"{what} {path} cannot be written; choose another path")
        return path
    folder, writable = nearest_folder(path.parent)
    if not folder.is_dir():
        raise AttnkitError(
            f"{what} {path} cannot be written: {folder} is a file, not a folder; "
            "choose another path"
        )
    if not writable:
        raise AttnkitError(
            f"{what} {path} cannot be written: no file can be made in {folder}; choose another path"
        )
    return path


def same_file(path: PathLike, other: PathLike) -> bool:
    """Whether `path` and `other` name one existing file (by another name, a hard or
    symbolic link, or the same name)."""
    try:
        return os.path.samefile(path, other)
    except (OSError, ValueError):  # one of them missing, or a name the system refuses
        return False


def _same_name(path: PathLike, other: PathLike) -> bool:
    """Whether `path` and `other` name one place, existing or not (an input read only when
    it exists, such as a plain corpus file read in place of its gzipped one)."""
    return os.path.realpath(path) == os.path.realpath(other)


def _is_stdin(path: Path) -> bool:
    """Whether `path` is the regular file that standard input reads (`< FILE`)."""
    try:
        held = os.fstat(sys.stdin.fileno())
        at = os.stat(path)
    except (OSError, AttributeError, ValueError):  # no file there, stdin closed or replaced
        return False
    return stat.S_ISREG(held.st_mode) and (held.st_dev, held.st_ino) == (at.st_dev, at.st_ino)


def _refuse_input(what: str, path: Path, name: str) -> None:
    raise AttnkitError(
        f"{what} {path} is also the input ({name}): writing it would destroy what the command "
        "reads; choose another path"
    )


def nearest_folder(path: PathLike) -> tuple[Path, bool]:
    """The nearest of `path` and its parents that exists, where its missing folders would be
    made, and whether a file can be made in it (never, where it is a file).

    Trying is the sure test, with a temporary file removed at once: permission bits
    say yes to root, even in /proc.
    """
    path = Path(path)
    nearest = next(p for p in (path, *path.parents) if p.exists())
    if not nearest.is_dir():
        return nearest, False
    try:
        with tempfile.TemporaryFile(dir=nearest):
            pass
    except OSError:
        return nearest, False
    return nearest, True


def open_binary(path: Path) -> IO[bytes]:
    """A file's bytes, ungzipped if its name ends in `.gz`."""
    if not path.is_file():
        raise AttnkitError(f"no text file at {path}; check the path")
    return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")


def atomic_write(path: PathLike, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` on a temporary file beside `path`, then rename it to `path`.

    The rename is atomic on POSIX, so readers see the old file or the new one,
    never a partial one; if `write` raises, the old file is left untouched. The
    file gets the mode any new file gets under the umask. A write refused for
    want of room stops with `WriteError`, which names the file and the reason.
    """
    path = Path(path)
    if path.is_dir():
        raise AttnkitError(f"{path} is a folder, so no file can be written there; give a file path")
    if path.exists() and (not path.is_file() or _is_descriptor(path)):
        return _write_in_place(path, write)
    if path.is_symlink():
        path = Path(os.path.realpath(path))  # the link stays, pointing at the new file
    existed = path.exists()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        write(Path(tmp))
        # mkstemp makes the file readable by its owner alone; a team shares run folders.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except AttnkitError:
        raise  # already a sentence
    except Exception as err:
        reason = _room_error(err, path.parent)
        if reason is None:
            raise
        intact = "its previous version is intact" if existed else "no partial file was left"
        raise WriteError(path, reason, intact) from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _is_descriptor(path: Path) -> bool:
    """Whether `path` names one of the process's open files (/dev/stdout, /dev/fd/N,
    /proc/self/fd/N), directly or through links: what the shell redirected, to be written
    through that name, even where it is a regular file."""
    name = str(path)
    for _ in range(8):  # links to links: /dev/stdout -> /proc/self/fd/1 -> the file
        if name.startswith(("/proc/", "/dev/fd/")):
            return True
        if not os.path.islink(name):
            return False
        name = os.path.join(os.path.dirname(name), os.readlink(name))
    return False


def _write_in_place(path: Path, write: Callable[[Path], None]) -> Path:
    """`write(path)` on a device, FIFO, socket or open descriptor, which renaming over would
    replace (or, through /proc, cannot reach: /proc/self/fd/1 of a pipe names no file)."""
    try:
        write(path)
    except AttnkitError:
        raise
    except OSError as err:
        raise AttnkitError(
            f"could not write {path} ({err.strerror or err}); choose another path"
        ) from None
    return path


def append_line(path: PathLike, line: str) -> None:
    """Add `line` at the end of a text file, whole or not at all.

    A write refused for want of room stops with `WriteError` and leaves the
    file as it was, so no half line spoils the lines before.
    """
    data = line.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError as err:
            if err.errno not in _ROOM:
                raise
            os.ftruncate(fd, size)
            raise WriteError(Path(path), err.strerror, "the lines before are intact") from None
    finally:
        os.close(fd)


def replace_folder(path: PathLike, write: Callable[[Path], None]) -> Path:
    """Call `write(stage)` on a new folder, then make `path` hold exactly what it wrote.

    The stage is made inside `path` (so on its file system), and only once
    `write` has finished are its entries moved up and the entries of `path`
    that it did not write removed: a failed `write` leaves `path` as it was.
    Whether `path` may be replaced is the caller's to check.
    """
    path = Path(path)
    made = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".new-", suffix=".tmp", dir=path))
    try:
        try:
            write(stage)
        except WriteError as err:
            inside = err.path.is_relative_to(stage)
            name = path / err.path.relative_to(stage) if inside else err.path
            intact = "nothing was left there" if made else f"{path} is as it was"
            raise WriteError(name, err.reason, intact) from None
        new = {entry.name for entry in stage.iterdir()}
        for entry in path.iterdir():
            if entry != stage and entry.name not in new:
                _remove(entry)
        for name in new:
            if (path / name).is_dir() and not (path / name).is_symlink():
                shutil.rmtree(path / name)  # os.replace puts a folder only where none is
            os.replace(stage / name, path / name)
    except BaseException:
        if made:
            shutil.rmtree(path, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return path


class WriteError(AttnkitError):
    """A file the operating system would not write for want of room: a full disk, a
    quota, a size limit. The sentence names the file, the reason and what is intact."""

    def __init__(self, path: Path, reason: str, intact: str) -> None:
        super().__init__(f"could not write {path} ({reason}); {intact}")
        self.path, self.reason = path, reason


# The errors of a write that found no room: disk full, quota exceeded, file too large.
_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def _room_error(err: BaseException, folder: Path) -> str | None:
    """The operating system's reason when `err` comes from a write that found no room.

    Python raises the OSError itself, torch keeps it as the context of its own
    error, and safetensors' writer names its number ("os error 28"). Torch's zip
    writer, given a path, says neither: then a disk with no room left speaks.
    """
    seen, cause = set(), err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno in _ROOM:
            return cause.strerror or os.strerror(cause.errno)
        cause = cause.__cause__ or cause.__context__
    number = re.search(r"os error (\d+)", str(err))
    if number and int(number.group(1)) in _ROOM:
        return os.strerror(int(number.group(1)))
    if not isinstance(err, OSError) and _no_room_left(folder):
        return os.strerror(errno.ENOSPC)
    return None


def _no_room_left(folder: Path) -> bool:
    try:
        stat = os.statvfs(folder)
    except (OSError, AttributeError):  # no statvfs on Windows
        return False
    return stat.f_bavail * stat.f_frsize < 1 << 20


def _umask() -> int:
    # The umask can be read only by setting it: set it back at once.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink()
