"""Go-style durations (``250ms``, ``1h30m``, ``0``): parse option values, format for humans.

The accepted grammar is Go's ``time.ParseDuration`` (docs/README.md#command-line), with
one deliberate narrowing: a leading ``-`` is refused, because none of our options can be
negative and a negative timeout silently meaning "already expired" is worse than a usage error.
Values are exact integer nanoseconds internally, like Go's ``time.Duration``; the public API
speaks float seconds because that is what Twisted's clocks take.
"""

from __future__ import annotations

import math
from fractions import Fraction

__all__ = ["format_duration", "parse_duration"]

_NS_PER_S = 1_000_000_000

# Go's Duration is an int64 of nanoseconds; anything beyond it is "out of range" there too.
_MAX_NS = 2**63 - 1
_MIN_NS = -(2**63)

# Go's unit table, both micro signs included: U+00B5 (MICRO SIGN) is what Go prints, U+03BC
# (GREEK SMALL LETTER MU) is what many keyboards and editors produce for the same thing.
_UNIT_NS: dict[str, int] = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,
    "\u03bcs": 1_000,
    "ms": 1_000_000,
    "s": _NS_PER_S,
    "m": 60 * _NS_PER_S,
    "h": 3600 * _NS_PER_S,
}

# More integer digits than this (after leading zeros) cannot fit in an int64 of nanoseconds
# whatever the unit; checking the length first also keeps a hostile 100 000-digit value from
# reaching int(), which would raise its own, unrelated ValueError.
_MAX_INT_DIGITS = 19
# Fraction digits past this cannot move the result by a whole nanosecond for any unit (Go
# itself stops accumulating them sooner), so they are read and dropped.
_MAX_FRAC_DIGITS = 30

_DIGITS = frozenset("0123456789")


def _is_digit(c: str) -> bool:
    # Not str.isdigit(): that accepts "٣" and "²", which Go (byte-wise) does not.
    return c in _DIGITS


def _invalid(text: str, why: str) -> ValueError:
    # repr() quotes the input and escapes newlines and invisible characters, so the message
    # stays on one line and shows exactly what was typed.
    return ValueError(f"invalid duration {text!r}: {why}")


def _parse_ns(text: str) -> int:
    """Parse *text* into non-negative integer nanoseconds, following Go's algorithm."""
    s = text
    if s.startswith("-"):
        raise _invalid(text, "must not be negative")
    if s.startswith("+"):
        s = s[1:]
    if s == "0":
        return 0
    if s == "":
        raise _invalid(text, "empty" if text == "" else "expected a number")

    total = 0
    i, n = 0, len(s)
    while i < n:
        if not (s[i] == "." or _is_digit(s[i])):
            raise _invalid(text, "expected a number")
        start = i
        while i < n and _is_digit(s[i]):
            i += 1
        int_digits = s[start:i]
        frac_digits = ""
        if i < n and s[i] == ".":
            i += 1
            frac_start = i
            while i < n and _is_digit(s[i]):
                i += 1
            frac_digits = s[frac_start:i]
        if not int_digits and not frac_digits:
            # "." or ".s": Go requires a digit on at least one side of the point.
            raise _invalid(text, "expected a number")
        unit_start = i
        while i < n and not (s[i] == "." or _is_digit(s[i])):
            i += 1
        unit = s[unit_start:i]
        if not unit:
            # Go's rule: only the literal "0" may go without a unit ("5" is an error, not 5 ns).
            raise _invalid(text, "missing unit (one of ns, us, µs, ms, s, m, h)")
        unit_ns = _UNIT_NS.get(unit)
        if unit_ns is None:
            raise _invalid(text, f"unknown unit {unit!r} (one of ns, us, µs, ms, s, m, h)")

        significant = int_digits.lstrip("0")
        if len(significant) > _MAX_INT_DIGITS:
            raise _invalid(text, "out of range")
        whole = int(significant or "0")
        frac_digits = frac_digits[:_MAX_FRAC_DIGITS]
        frac = Fraction(int(frac_digits or "0"), 10 ** len(frac_digits))
        # Truncating the fractional nanoseconds matches Go ("1.5ns" is 1ns).
        total += whole * unit_ns + math.floor(frac * unit_ns)
        if total > _MAX_NS:
            raise _invalid(text, "out of range")
    return total


def parse_duration(text: str) -> float:
    """
    Parse a Go-style duration into seconds.

    Accepts what Go's ``time.ParseDuration`` accepts except negatives: ``0``, ``250ms``,
    ``10s``, ``30m``, ``1h30m``, ``1.5h``, ``.5s``, ``300us``/``300µs``, ``10ns``, with an
    optional leading ``+``. Units are case-sensitive; whitespace is never allowed; a number
    other than a lone ``0`` needs a unit.

    :param text: the option value exactly as given.
    :return: the duration in seconds (exact to the nanosecond, then rounded to a float).
    :raises ValueError: if *text* is not a valid, non-negative duration that fits Go's int64
        of nanoseconds (about 292 years); the message quotes *text*.
    """
    return _parse_ns(text) / _NS_PER_S


def _fixed(value: int, scale: int) -> str:
    """``value / scale`` in decimal, trailing zeros (and a bare point) dropped."""
    whole, rest = divmod(value, scale)
    if not rest:
        return str(whole)
    width = len(str(scale)) - 1
    return f"{whole}.{rest:0{width}d}".rstrip("0")


def _format_ns(ns: int) -> str:
    """Go's ``Duration.String`` for integer nanoseconds."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u < 1_000:
        return f"{sign}{u}ns"
    if u < 1_000_000:
        return f"{sign}{_fixed(u, 1_000)}\u00b5s"
    if u < _NS_PER_S:
        return f"{sign}{_fixed(u, 1_000_000)}ms"
    whole_s, frac_ns = divmod(u, _NS_PER_S)
    minutes, secs = divmod(whole_s, 60)
    hours, minutes = divmod(minutes, 60)
    seconds = _fixed(secs * _NS_PER_S + frac_ns, _NS_PER_S)
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}s"
    if minutes:
        return f"{sign}{minutes}m{seconds}s"
    return f"{sign}{seconds}s"


def format_duration(seconds: float) -> str:
    """
    Format seconds the way Go's ``Duration.String`` does.

    ``0s``, ``250ms``, ``1.5µs``, ``10s``, ``30m0s``, ``1h30m0s``: the largest units down to
    seconds, or a single sub-second unit below one second. The result always parses back
    with :func:`parse_duration` (for non-negative input) to the same nanosecond.

    :param seconds: the duration; rounded to the nearest nanosecond. Negative values are
        formatted with a leading ``-`` as Go does, for logs, even though
        :func:`parse_duration` refuses them.
    :return: the canonical text.
    :raises ValueError: if *seconds* is NaN, infinite, or outside Go's int64 of nanoseconds.
    """
    if not math.isfinite(seconds):
        raise ValueError(f"cannot format duration {seconds!r}: not a finite number")
    # Fraction(float) is exact, so the only rounding is to the nearest nanosecond.
    ns = round(Fraction(seconds) * _NS_PER_S)
    if not _MIN_NS <= ns <= _MAX_NS:
        raise ValueError(f"cannot format duration {seconds!r}: out of range")
    return _format_ns(ns)
