"""The shared checks: each rule, its sentence, and the nearest name for a misspelt one."""

import pytest

from attnkit.checks import lookup, non_negative_int, positive_int, unknown, within
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
