"""The recipes: run configs that ship inside the package, each a TOML file named for its run.

`attnkit recipes` lists them; `attnkit train NAME` runs one by its bare name
(`attnkit train tinyshakespeare_char`), while a path to a TOML file still names
any other run config. A recipe opens with a comment line that says, in one
line, what it trains and what it reaches; the lines after it say the rest.

The files live beside this module and are package data, so a plain
`pip install attnkit` (not only a clone) has every recipe.
"""

from __future__ import annotations

from pathlib import Path

from attnkit.checks import closest, unknown
from attnkit.errors import AttnkitError

FOLDER = Path(__file__).parent
SUFFIX = ".toml"


def names() -> list[str]:
    """The recipes' names, sorted: each file's name without `.toml`."""
    return sorted(p.stem for p in FOLDER.glob(f"*{SUFFIX}"))


def path(name: str) -> Path:
    """The file of the recipe `name`; an unknown name stops with the nearest one."""
    if name not in names():
        raise AttnkitError(
            unknown("recipe", name, names(), otherwise="`attnkit recipes` lists them")
        )
    return FOLDER / f"{name}{SUFFIX}"


def summary(name: str) -> str:
    """The recipe's first line, its one-line description, without the comment sign."""
    first = path(name).read_text(encoding="utf-8").splitlines()[0]
    return first.removeprefix("#").strip()


def resolve(config: str | Path) -> Path:
    """The run config `config` names: a file that exists, else the recipe of that name.

    A path wins over a recipe of the same name, so a file of one's own is never shadowed.
    Neither is refused in one sentence that names the nearest recipe.
    """
    given = Path(config)
    if given.is_file():
        return given
    name = given.name.removesuffix(SUFFIX)
    if str(config) in (name, given.name) and name in names():
        return path(name)
    near = closest(name, names())
    hint = f"did you mean the recipe {near!r}?" if near else "`attnkit recipes` lists them"
    raise AttnkitError(
        f"no run config at {config}: no such file, and no recipe of that name; {hint}"
    )
