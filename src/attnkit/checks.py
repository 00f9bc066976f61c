"""The checks every configuration shares, so that each rule is written, and worded, once.

A bad value stops with one sentence that names the setting, what it holds and
what it may be; a misspelt name gets the nearest valid one ("did you mean").
`ModelConfig`, the run config's sections and `GenerationConfig` all check
through these.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from attnkit.errors import AttnkitError

T = TypeVar("T")


def check(ok: bool, message: str) -> None:
    """Stop with `message` unless `ok`."""
    if not ok:
        raise AttnkitError(message)


def choice(name: str, value: object, allowed: Sequence[str]) -> None:
    """`value` of the setting `name` must be one of `allowed`."""
    check(value in allowed, f"{name} {value!r} is not one of {', '.join(allowed)}")


def finite(name: str, value: float) -> None:
    """`value` of the setting `name` must be a number, not NaN or infinite."""
    check(math.isfinite(value), f"{name} must be a finite number, got {value!r}")


def finite_fields(settings: object, section: str = "") -> None:
    """Every float field of the dataclass `settings` must be finite (`finite`); `section`
    names the config section they are keys of, for the message."""
    for setting in dataclasses.fields(settings):
        value = getattr(settings, setting.name)
        if isinstance(value, float):
            finite(f"{section}.{setting.name}" if section else setting.name, value)


def each(rule: Callable[[str, Any], None], section: str, values: object, *names: str) -> None:
    """Apply the check `rule` to the keys `names` of one config section's `values`."""
    for name in names:
        rule(f"{section}.{name}", getattr(values, name))


def positive(name: str, value: float) -> None:
    """`value` of the setting `name` must be over zero."""
    check(value > 0, f"{name} must be positive, got {value!r}")


def non_negative(name: str, value: float) -> None:
    """`value` of the setting `name` must be zero or more."""
    check(value >= 0, f"{name} must be zero or more, got {value!r}")


def positive_int(name: str, value: object) -> None:
    """`value` must be an integer (not a bool) over zero: a size or a count."""
    check(_is_int(value) and value > 0, f"{name} must be a positive integer, got {value!r}")


def non_negative_int(name: str, value: object, zero: str = "off") -> None:
    """`value` must be an integer (not a bool) of zero or more; `zero` says what 0 means."""
    check(
        _is_int(value) and value >= 0,
        f"{name} must be a non-negative integer (0 for {zero}), got {value!r}",
    )


def within(name: str, value: float, interval: str) -> None:
    """`value` must lie in `interval`, written as in mathematics: "[0, 1)", "(0, 1]"."""
    low, high = (float(end) for end in interval[1:-1].split(","))
    above = value > low if interval[0] == "(" else value >= low
    below = value < high if interval[-1] == ")" else value <= high
    check(above and below, f"{name} must be in {interval}, got {value!r}")


def closest(name: str, valid: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The valid name nearest to a misspelt `name`, or None when none is near."""
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=cutoff)
    return close[0] if close else None


def unknown(
    what: str,
    name: str,
    valid: Sequence[str],
    cutoff: float = 0.6,
    *,
    owner: str = "",
    otherwise: str = "",
) -> str:
    """The sentence for a `name` that is none of `valid`: the nearest one, or all of them.

    `what` names the kind of thing ("preset", "key", ...): "unknown preset 'x'",
    or with an `owner`, "ModelConfig has no field 'x'". With no valid name near,
    `otherwise` is said instead of listing them all.
    """
    head = f"{owner} has no {what} {name!r}" if owner else f"unknown {what} {name!r}"
    near = closest(name, valid, cutoff)
    if near:
        return f"{head}; did you mean {near!r}?"
    return f"{head}; {otherwise or 'the valid ones are ' + ', '.join(valid)}"


def known(
    what: str, names: Iterable[str], valid: Sequence[str], *, owner: str = "", otherwise: str = ""
) -> None:
    """Every one of `names` must be in `valid`; the first that is not (in sorted order) stops
    with the nearest valid name (`unknown`)."""
    wrong = sorted(set(names) - set(valid))
    if wrong:
        raise AttnkitError(unknown(what, wrong[0], valid, owner=owner, otherwise=otherwise))


def lookup(what: str, name: str, table: Mapping[str, T]) -> T:
    """The entry `name` of `table`; an unknown name stops with the nearest valid one."""
    known(what, [name], list(table))
    return table[name]


def of_type(name: str, value: object, kind: type | tuple[type, ...], hint: str = "") -> None:
    """A public API's argument `name` must be a `kind` (the Python API's counterpart of a
    config's checks: a list where a tensor belongs would fail deep inside torch)."""
    if not isinstance(value, kind):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        wanted = " or ".join(_type_name(k) for k in kinds)
        raise AttnkitError(
            f"{name} must be {with_article(wanted)}, not {with_article(type(value).__name__)}"
            + (f"; {hint}" if hint else "")
        )


# The largest seed: numpy's generators and torch's both take any int from 0 to it.
MAX_SEED = 2**32 - 1


def seed_value(name: str, value: object) -> None:
    """A seed must be an int from 0 to MAX_SEED (torch overflows past 2**64, numpy past 2**32)."""
    check(
        _is_int(value) and 0 <= value <= MAX_SEED,  # type: ignore[operator]
        f"{name} must be a whole number from 0 to {MAX_SEED}, not {value!r}",
    )


def _type_name(kind: type) -> str:
    """`kind` as a user writes it: `ModelConfig`, `list`, `torch.Tensor`."""
    package = kind.__module__.split(".")[0]
    return (
        kind.__qualname__
        if package in ("attnkit", "builtins")
        else f"{package}.{kind.__qualname__}"
    )


def token_ids(name: str, ids: Sequence[object]) -> list[int]:
    """`ids` (a list, a tuple or a 1-D tensor) as a list of ints from 0 up: token ids."""
    values = ids.tolist() if hasattr(ids, "tolist") else ids
    of_type(name, values, (list, tuple), "give a list of token ids or a 1-D tensor")
    for at, value in enumerate(values):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
            raise AttnkitError(f"{name}[{at}] is {value!r}, not a token id (an int from 0 up)")
    return [int(value) for value in values]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def with_article(noun: str) -> str:
    """The noun with its indefinite article: "a decoder", "an encoder-decoder"."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"
