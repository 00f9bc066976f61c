"""The runs a server serves: run folders loaded, each under its folder's name.

`runs/multi30k_de_en` is served as `multi30k_de_en`; the name is what a request's
`model` field says. Each run keeps the [data] section it was trained with, so the
server prepares a request's text as `attnkit translate` does (`prepare_sources`).
"""

from __future__ import annotations

from pathlib import Path

from attnkit.errors import AttnkitError
from attnkit.run import load_run
from attnkit.serve.work import Served


def served_runs(paths: list[str], compute_type: str = "float32") -> list[Served]:
    """The runs, loaded, each under its folder's name (the same name twice is refused).

    compute_type: the linear layers' type for decoding (float32, int8, bf16, auto).
    """
    names = [Path(p).resolve().name for p in paths]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise AttnkitError(f"two runs are named {twice[0]!r}; serve folders of different names.")
    served = []
    for name, path in zip(names, paths, strict=True):
        run = load_run(path, compute_type=compute_type)  # logs the type it chose
        served.append(Served(name, run.model, run.tokenizer, run.data))
    return served
