"""Tests for nvpair.common.durations: Go's duration form (docs/README.md#command-line)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvpair.common.durations import format_duration, parse_duration

MAX_NS = 2**63 - 1

VALID: list[tuple[str, float]] = [
    # The documented examples.
    ("0", 0.0),
    ("250ms", 0.25),
    ("10s", 10.0),
    ("30m", 1800.0),
    ("1h30m", 5400.0),
    # Every unit, both micro signs included.
    ("10ns", 10e-9),
    ("300us", 300e-6),
    ("300\u00b5s", 300e-6),
    ("300\u03bcs", 300e-6),
    ("2ms", 0.002),
    ("1s", 1.0),
    ("1m", 60.0),
    ("1h", 3600.0),
    # Fractions, on either side of the point.
    ("1.5h", 5400.0),
    ("1.5s", 1.5),
    (".5s", 0.5),
    ("5.s", 5.0),
    ("0.000000001s", 1e-9),
    ("1.0000000001s", 1.0),  # below a nanosecond: truncated, as Go does
    ("1.5ns", 1e-9),
    # Zero with a unit, and leading zeros.
    ("0s", 0.0),
    ("0.0s", 0.0),
    ("00010s", 10.0),
    # Units in any order and repeated, as Go allows.
    ("1h2m3s4ms5us6ns", 3723.004005006),
    ("30m1h", 5400.0),
    ("1s1s", 2.0),
    # Explicit plus sign.
    ("+0", 0.0),
    ("+5s", 5.0),
    # Go's exact int64 limit is accepted.
    ("9223372036854775807ns", MAX_NS / 1e9),
    ("2562047h47m16.854775807s", MAX_NS / 1e9),
    # Excess fraction digits are harmless.
    ("1." + "0" * 500 + "s", 1.0),
]


@pytest.mark.parametrize(("text", "seconds"), VALID, ids=[t for t, _ in VALID])
def test_parse_valid(text: str, seconds: float) -> None:
    """A value in Go's duration form parses to its length in seconds."""
    assert math.isclose(parse_duration(text), seconds, rel_tol=1e-15, abs_tol=0.0)


INVALID: list[tuple[str, str]] = [
    ("", "empty"),
    ("+", "expected a number"),
    ("-", "negative"),
    ("-5s", "negative"),
    ("-0", "negative"),
    ("-0s", "negative"),
    ("5", "missing unit"),
    ("10", "missing unit"),
    ("00", "missing unit"),
    ("0.0", "missing unit"),
    ("1h30", "missing unit"),
    ("1.5", "missing unit"),
    ("5x", "unknown unit"),
    ("5S", "unknown unit"),
    ("5sec", "unknown unit"),
    ("5d", "unknown unit"),
    ("5 s", "unknown unit"),
    ("5s ", "unknown unit"),
    ("5s\n", "unknown unit"),
    ("1h 30m", "unknown unit"),
    (" 5s", "expected a number"),
    ("\t5s", "expected a number"),
    ("s", "expected a number"),
    ("ms", "expected a number"),
    (".", "expected a number"),
    (".s", "expected a number"),
    ("1..5s", "missing unit"),
    ("1.5.5s", "missing unit"),
    ("++5s", "expected a number"),
    ("+-5s", "expected a number"),
    ("\u0665s", "expected a number"),  # ARABIC-INDIC DIGIT FIVE: isdigit(), but not Go's
    ("5\u0665s", "unknown unit"),
    ("1e3s", "unknown unit"),
    ("inf", "expected a number"),
    ("nan", "expected a number"),
    ("0x10s", "unknown unit"),
    ("5_0s", "unknown unit"),
    # Beyond Go's int64 of nanoseconds.
    ("9223372036854775808ns", "out of range"),
    ("2562048h", "out of range"),
    ("2562047h47m16.854775808s", "out of range"),
    ("9223372036854775807ns1ns", "out of range"),
    ("1" + "0" * 5000 + "s", "out of range"),
]


@pytest.mark.parametrize(("text", "why"), INVALID, ids=[repr(t) for t, _ in INVALID])
def test_parse_invalid(text: str, why: str) -> None:
    """
    Anything outside Go's form, a negative, or an overflow is a ValueError that quotes the
    input and says why, on one line (a malformed option is a usage error, never a default).
    """
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    message = str(info.value)
    assert repr(text) in message
    assert why in message
    assert "\n" not in message


FORMATTED: list[tuple[float, str]] = [
    (0.0, "0s"),
    (1e-9, "1ns"),
    (999e-9, "999ns"),
    (1e-6, "1\u00b5s"),
    (1.5e-6, "1.5\u00b5s"),
    (300e-6, "300\u00b5s"),
    (0.001, "1ms"),
    (0.25, "250ms"),
    (0.0015, "1.5ms"),
    (0.999999999, "999.999999ms"),
    (1.0, "1s"),
    (1.5, "1.5s"),
    (10.0, "10s"),
    (60.0, "1m0s"),
    (61.0, "1m1s"),
    (1800.0, "30m0s"),
    (3600.0, "1h0m0s"),
    (5400.0, "1h30m0s"),
    (3723.004005006, "1h2m3.004005006s"),
    (360000.0, "100h0m0s"),
    (-1.5, "-1.5s"),
    (-0.25, "-250ms"),
    (4e-10, "0s"),  # rounds to the nearest nanosecond
    (6e-10, "1ns"),
]


@pytest.mark.parametrize(("seconds", "text"), FORMATTED, ids=[t for _, t in FORMATTED])
def test_format(seconds: float, text: str) -> None:
    """format_duration gives Go's Duration.String form."""
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -math.inf, 1e10, -1e10])
def test_format_rejects_unrepresentable(seconds: float) -> None:
    """NaN, infinities and values beyond Go's int64 of nanoseconds cannot be formatted."""
    with pytest.raises(ValueError, match="cannot format duration"):
        format_duration(seconds)


durations = st.floats(min_value=0.0, max_value=MAX_NS / 1e9 - 1, allow_nan=False)


@given(durations)
def test_round_trip_is_identity(seconds: float) -> None:
    """parse(format(x)) is x to within the half nanosecond format rounds to."""
    assert math.isclose(parse_duration(format_duration(seconds)), seconds, abs_tol=5e-10)


@given(durations)
def test_formatted_form_is_canonical(seconds: float) -> None:
    """Formatting a parsed canonical text gives the same text back: it is a fixed point."""
    text = format_duration(seconds)
    assert format_duration(parse_duration(text)) == text


@given(st.integers(min_value=0, max_value=2**52))
def test_round_trip_is_exact_for_whole_nanoseconds(ns: int) -> None:
    """Up to 2**52 ns (~52 days) every nanosecond count survives format and parse exactly."""
    seconds = ns / 1e9
    assert parse_duration(format_duration(seconds)) == seconds
