"""A new run's folder: what a training may start in, and what it may replace.

A new run starts in an empty or missing folder, or over a run killed before its
first checkpoint. It never starts over a run it could resume (`--resume`), over
a trained model whose trainer state was deleted, nor over files attnkit did not
write; `--overwrite` (`clear_run`) empties a folder of an earlier run first.
"""

from __future__ import annotations

import logging
import shutil

from attnkit.cut_writes import is_partial
from attnkit.errors import AttnkitError
from attnkit.run import RunFolder

log = logging.getLogger(__name__)


def check_new_run(folder: RunFolder, lock_left: bool = False) -> None:
    """Refuse to start a new run in `folder` when it holds a run (which `--resume`
    continues), a trained model (whose trainer state was deleted, as users do once a run is
    done: `--overwrite` replaces it) or files that are not one: attnkit never writes over a
    model without being told to, nor over a folder it did not make.

    A run killed before its first checkpoint (a run config, no weights) starts again, and so
    does one killed while it wrote its first checkpoint: the lock it left (`lock_left`, seen
    before `lock.check_free` took it away) says it never ended, and the trainer state, written
    last, is missing; its partial files are removed.
    """
    if folder.trainer_state.exists():
        raise AttnkitError(
            f"{folder.root} already holds a run; pass --resume to continue it, --overwrite "
            "(overwrite=True) to train a new one in its place, or choose another train.out_dir"
        )
    if not folder.root.is_dir():
        return
    if lock_left and len(folder.saved_steps()) <= 1 and trained_files(folder):
        log.warning(
            "%s: a training was killed while it wrote its first checkpoint (its lock is left "
            "and no trainer state was written); starting again",
            folder.root,
        )
        clear_run(folder)
        return
    if trained := trained_files(folder):
        raise AttnkitError(
            f"{folder.root} holds a trained model ({', '.join(trained)}) but no "
            f"{folder.trainer_state.name} to resume from; pass --overwrite (overwrite=True) to "
            "train a new one in its place, or choose another train.out_dir"
        )
    if folder.run_config.exists():
        return
    # What a start leaves before it writes the run config: the lock, the fingerprint, under
    # torchrun the tokenizer that rank 0 made for the other ranks, a sentence-embedding task's
    # pooling.json (written before any weights, which need it to load), a kill's partial files.
    own = {folder.lock.name, folder.fingerprint.name, folder.tokenizer.name, folder.pooling.name}
    if any(path.name not in own and not is_partial(path) for path in folder.root.iterdir()):
        raise AttnkitError(
            f"train.out_dir {folder.root} holds files that are not an attnkit run; choose an "
            "empty or new folder"
        )


def trained_files(folder: RunFolder) -> list[str]:
    """The names of what in `folder` a training made and a new one would replace: the
    weights (the latest, the best, a step's) and word vectors."""
    found = [p.name for p in (folder.weights, folder.vectors) if p.is_file()]
    if folder.best_weights.is_file():
        found.append(str(folder.best_weights.relative_to(folder.root)))
    if steps := folder.saved_steps():
        found.append(f"{len(steps)} step checkpoints")
    return found


def clear_run(folder: RunFolder) -> None:
    """Empty `folder` of an earlier run for a new one (`--overwrite`): every file and folder
    a training writes there goes, so nothing stale (a later step's checkpoint, old metrics)
    mixes with the new run; a folder holding anything else is refused, since attnkit
    replaces only what it made."""
    if not folder.root.is_dir():
        return
    foreign = sorted(e.name for e in folder.root.iterdir() if not folder.owns(e))
    if foreign:
        more = ", ..." if len(foreign) > 5 else ""
        raise AttnkitError(
            f"{folder.root} holds {', '.join(foreign[:5])}{more}, which attnkit did not write, "
            "so it will not replace that folder, even with --overwrite; move them away or "
            "choose another train.out_dir"
        )
    for entry in folder.root.iterdir():
        if entry == folder.lock:
            continue  # the lock is checked free, and stays a lock
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    log.info("removed the earlier run in %s (--overwrite)", folder.root)
