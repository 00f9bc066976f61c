"""The values of a run config's TOML: read from `--set` overrides, checked, written back.

A run config's keys are typed by the fields of its sections (`attnkit.train.run_config`);
`coerce` checks a value from the file or an override against that type, so both are read
the same way, and `toml_value` writes one back for `run_config.toml`.
"""

from __future__ import annotations

import types
import typing
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

from attnkit.checks import finite
from attnkit.errors import AttnkitError


def apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`section.key=value` strings merged into a parsed config; values are TOML literals.

    A value that is not a TOML literal is taken as a string, so
    `data.corpus=multi30k` needs no quotes.
    """
    # A key written before any [section] header is no table; `RunConfig.from_dict` names it.
    data = {name: dict(v) if isinstance(v, dict) else v for name, v in data.items()}
    for item in overrides:
        name, sep, text = item.partition("=")
        section, dot, key = name.strip().partition(".")
        if not sep or not dot or not key:
            raise AttnkitError(
                f"--set {item!r} is not section.key=value; for example --set train.lr=5e-4"
            )
        try:
            value = tomllib.loads(f"v = {text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = text.strip()
        table = data.setdefault(section, {})
        if isinstance(table, dict):
            table[key] = value
    return data


def coerce(name: str, value: Any, hint: Any) -> Any:
    """`value` checked against the type `hint`; an int is accepted where a float is due."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for option in options:
        if option is type(None) and value is None:
            return None
        if option is bool and isinstance(value, bool):
            return value
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        if option is float and is_number:
            finite(name, value)
            return float(value)
        if option is str and isinstance(value, str):
            return value
        is_list = typing.get_origin(option) is tuple and isinstance(value, list | tuple)
        if is_list and all(isinstance(item, str) for item in value):
            return tuple(value)
    wanted = " or ".join(
        "a list of strings" if typing.get_origin(o) is tuple else getattr(o, "__name__", str(o))
        for o in options
        if o is not type(None)
    )
    raise AttnkitError(f"{name} must be {wanted}, got {value!r}")


def toml_value(value: Any) -> str:
    """`value` (a bool, string, number or list of them) as a TOML literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return repr(value)
