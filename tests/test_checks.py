"""The shared checks: each rule, its sentence, and the nearest name for a misspelt one."""

import math
from dataclasses import dataclass

import pytest

from attnkit.checks import (
    finite,
    finite_fields,
    lookup,
    non_negative_int,
    positive_int,
    unknown,
    within,
)
from attnkit.errors import AttnkitError


@pytest.mark.parametrize(
    ("value", "interval", "ok"),
    [
        (0.0, "[0, 1)", True),
        (1.0, "[0, 1)", False),
        (0.0, "(0, 1]", False),
        (1.0, "(0, 1]", True),
        (0.5, "(0, 1)", True),
        (-0.1, "[0, 1]", False),
    ],
)
def test_within_reads_open_and_closed_ends(value: float, interval: str, ok: bool) -> None:
    if ok:
        within("p", value, interval)
    else:
        with pytest.raises(AttnkitError, match=rf"^p must be in \{interval[0]}0, 1\{interval[-1]}"):
            within("p", value, interval)


@pytest.mark.parametrize("value", [0, -1, 2.0, True, "3"])
def test_positive_int_refuses_what_is_not_a_count(value: object) -> None:
    with pytest.raises(AttnkitError, match="n must be a positive integer, got"):
        positive_int("n", value)


def test_non_negative_int_says_what_zero_means() -> None:
    non_negative_int("window", 0)
    with pytest.raises(AttnkitError, match=r"window must be a non-negative integer \(0 for off\)"):
        non_negative_int("window", -2)


def test_lookup_names_the_nearest_entry_or_all_of_them() -> None:
    table = {"tiny": 1, "paper-base": 2}
    assert lookup("preset", "tiny", table) == 1
    with pytest.raises(AttnkitError, match=r"unknown preset 'tinny'; did you mean 'tiny'\?$"):
        lookup("preset", "tinny", table)
    assert unknown("preset", "xyz", list(table)) == (
        "unknown preset 'xyz'; the valid ones are tiny, paper-base"
    )


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_finite_refuses_nan_and_infinity(value: float) -> None:
    finite("lr", 1e-3)
    with pytest.raises(AttnkitError, match=r"^lr must be a finite number, got -?(nan|inf)$"):
        finite("lr", value)


def test_finite_fields_checks_every_float_field_under_its_section() -> None:
    @dataclass
    class Section:
        steps: int = 3
        lr: float = 1e-3

    finite_fields(Section())
    with pytest.raises(AttnkitError, match=r"^train\.lr must be a finite number, got nan$"):
        finite_fields(Section(lr=math.nan), "train")
    with pytest.raises(AttnkitError, match=r"^lr must be a finite number, got inf$"):
        finite_fields(Section(lr=math.inf))
