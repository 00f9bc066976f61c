"""A Hub id as a run folder, imported once: what `attnkit serve ORG/NAME` serves.

    <cache>/hub-runs/ORG--NAME/REVISION     the run folder `import_hf` makes of the
                                            snapshot REVISION of ORG/NAME

<cache> is attnkit's cache, the one the corpora use (`$ATTNKIT_CACHE`, else
`$XDG_CACHE_HOME/attnkit`, else `~/.cache/attnkit`). The id is resolved as
`attnkit import hf` resolves it (`model_folder`: the huggingface_hub cache, a
download where files are missing, one sentence offline), so both commands read the
same snapshot. The run is built in a hidden folder beside its place and renamed there
only when complete: a start killed while converting leaves no half run, and a later
start that finds the folder serves it without converting again. A new revision of
the model (a new snapshot) is a new folder.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from attnkit.data.corpora import cache_dir
from attnkit.interop.folder import is_hub_id, model_folder
from attnkit.interop.hf import import_hf


def hub_runs_dir() -> Path:
    """Where runs imported from Hub ids are kept: `hub-runs` beside the corpora's `data`."""
    return cache_dir().parent / "hub-runs"


def run_folder(path: str) -> str | Path:
    """`path` as it is where it exists or is not shaped like a Hub id, else the id's run
    folder (`hub_run`): how a command that names a run takes an id too."""
    return hub_run(path) if not Path(path).exists() and is_hub_id(path) else path


def hub_run(repo_id: str) -> Path:
    """The run folder of the Hub id `repo_id` (ORG/NAME or NAME), imported the first time
    and reused after; refused in one sentence where `model_folder` refuses the id."""
    snapshot = model_folder(repo_id)
    target = hub_runs_dir() / repo_id.replace("/", "--") / snapshot.name
    if target.is_dir():  # only a complete run is ever renamed to this name
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # A name of its own (two starts at once build apart), made by mkdir, which gives the
    # umask's mode: mkdtemp's 0700 would become the run folder's when renamed.
    stage = target.parent / f".{snapshot.name}-{os.getpid()}-{secrets.token_hex(4)}.part"
    stage.mkdir()
    try:
        import_hf(snapshot, stage)
        try:
            os.rename(stage, target)
        except OSError:
            if not target.is_dir():  # not another start that finished first: a real failure
                raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return target
