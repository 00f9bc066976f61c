"""The training lock of a run folder: one training at a time writes it.

    RUN_DIR/train.lock    {"pid": ..., "host": ...} of the training that holds it

The lock is an advisory `flock` on that file, which the kernel releases when
its process ends in any way (kill -9 included), and which works across the
hosts of a network filesystem that supports it (NFS on Linux). The holder's
pid and host are written inside only to name it: a second training refuses
in one sentence that names them. The holder removes the file when it ends; a
file left behind by a training that was killed is a stale lock, taken over
with a log line. Under DDP only rank 0 holds the lock, and every rank refuses
when it cannot. Where there is no `fcntl` (Windows) run folders are not locked.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections.abc import Callable, Iterator

from attnkit.errors import AttnkitError
from attnkit.run import RunFolder
from attnkit.train import distributed as dist

try:
    import fcntl
except ModuleNotFoundError:  # Windows: no advisory locks of this kind
    fcntl = None

log = logging.getLogger(__name__)


@contextlib.contextmanager
def hold(
    folder: RunFolder, *, is_main: bool = True, check: Callable[[], None] | None = None
) -> Iterator[None]:
    """Hold the training lock of `folder` (made if missing) while the block runs.

    Rank 0 (`is_main`) takes it, then runs `check` (which may refuse the folder, as a
    new run's does one it must not write); under DDP every rank learns whether it could,
    so that all of them refuse together rather than wait for rank 0 forever, and before
    rank 0 writes anything.
    """
    fd, refusal = None, None
    # The folders that taking the lock makes: a start refused inside leaves none behind.
    made = [p for p in (folder.root, *folder.root.parents) if not p.exists()] if is_main else []
    if is_main:
        try:
            fd = _acquire(folder)
            if check is not None:
                check()
        except AttnkitError as err:
            refusal = str(err)
    refusal = dist.broadcast_object(refusal)
    try:
        if refusal:
            raise AttnkitError(refusal)
        yield
    finally:
        if fd is not None:
            _release(folder, fd)
        for path in made:  # deepest first; one that holds anything stays, with its parents
            try:
                path.rmdir()
            except OSError:
                break


def check_free(folder: RunFolder) -> None:
    """Refuse at once when another training holds the lock of `folder`: before the work
    that comes before training (a tokenizer trained, the data read), which would be lost.
    `hold` takes the lock when training starts."""
    if folder.lock.exists():
        fd = _acquire(folder)
        if fd is not None:
            _release(folder, fd)


def _holder(folder: RunFolder) -> str:
    """Who the lock file names, in words: 'pid 123 on host-a' ('an unknown process' if none)."""
    try:
        with open(folder.lock, encoding="utf-8") as f:
            return _describe(f.read())
    except OSError:
        return "an unknown process"


def _acquire(folder: RunFolder) -> int | None:
    """The descriptor that holds the lock of `folder` (None where it cannot be locked)."""
    if fcntl is None:
        log.warning("this platform cannot lock %s: run one training at a time in it", folder.root)
        return None
    while True:
        fd = _open(folder)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AttnkitError(
                f"another training ({_holder(folder)}) is writing the run folder {folder.root}; "
                "wait for it to finish, stop it, or choose another train.out_dir"
            ) from None
        except OSError as err:  # a filesystem without locks
            os.close(fd)
            log.warning(
                "%s cannot be locked (%s): run one training at a time in it", folder.root, err
            )
            return None
        # The holder may have removed the file between our open and our lock: this lock is
        # then on a file no one else sees; take the one now at the path.
        if _same_file(fd, folder):
            break
        os.close(fd)
    previous = os.pread(fd, 4096, 0).decode("utf-8", "replace")
    if previous.strip():
        log.warning(
            "took over the lock of %s left by a training that ended without releasing it (%s)",
            folder.root,
            _describe(previous),
        )
    record = json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, record, 0)
    return fd


def _open(folder: RunFolder) -> int:
    """The lock file of `folder`, opened (and the folder and the file made if missing)."""
    try:
        folder.root.mkdir(parents=True, exist_ok=True)
        return os.open(folder.lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise AttnkitError(
            f"the run folder {folder.root} cannot be written ({err.strerror}); choose another "
            "train.out_dir"
        ) from None


def _release(folder: RunFolder, fd: int) -> None:
    # Removed before it is unlocked, so that no one takes a lock on a file about to vanish.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(folder.lock)
    os.close(fd)


def _same_file(fd: int, folder: RunFolder) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(folder.lock))
    except FileNotFoundError:
        return False


def _describe(text: str) -> str:
    try:
        record = json.loads(text)
        return f"pid {int(record['pid'])} on {record['host']}"
    except (ValueError, KeyError, TypeError):
        return "an unknown process"
