"""Log records as lines a person reads: time, level, message, then ``key=value`` fields
(docs/README.md#logging).

Pure: a record's parts in, one line out. Every value that lands in a line is escaped so that it
cannot pass for something else: a newline or any other unprintable character is written as an
escape, never as itself, so a value cannot begin a line; a field value with a space, a quote, a
backslash or ``=`` is quoted, so it cannot end its field and begin another. A value substituted
into the message is quoted when it holds a quote, a backslash or ``=`` (spaces are prose there),
so no ``key=value`` is ever read out of a message either.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Iterable, Mapping
from string import Formatter
from typing import Any

#: A field value that needs no quotes: no space, quote, backslash or ``=``, and printable.
_BARE_FIELD = re.compile(r'[^\s"=\\]+')
#: A value in a message that needs no quotes: spaces allowed, the rest as for a field.
_BARE_IN_MESSAGE = re.compile(r'[^"=\\]*')
#: A field name we write: anything else is not a name we gave a field, so it is left out.
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped_char(char: str) -> str:
    known = _ESCAPES.get(char)
    if known is not None:
        return known
    if char.isprintable():
        return char
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def quoted(text: str) -> str:
    """``text`` in double quotes, with quotes, backslashes and unprintable characters escaped."""
    return '"' + "".join(map(_escaped_char, text)) + '"'


def _unprintable_escaped(text: str) -> str:
    """``text`` with only what is unprintable escaped (a traceback's quotes read as they are)."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escaped_char(char) for char in text)


def _plain(text: str, bare: re.Pattern[str]) -> bool:
    # isprintable(): no control character, line or paragraph separator, nor any other
    # character Unicode calls "Other" or "Separator" (the ASCII space excepted).
    return bare.fullmatch(text) is not None and text.isprintable()


def field_value(value: object) -> str:
    """A field's value as it follows ``key=``: bare when nothing in it could be misread."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    return text if text and _plain(text, _BARE_FIELD) else quoted(text)


def message_value(text: str) -> str:
    """A value as substituted into a message: bare unless it holds a quote, a backslash, ``=``
    or an unprintable character."""
    return text if _plain(text, _BARE_IN_MESSAGE) else quoted(text)


class _EscapingFormatter(Formatter):
    """``str.format`` whose every substituted value is made safe for a message."""

    def format_field(self, value: Any, format_spec: str) -> str:
        return message_value(super().format_field(value, format_spec))


_FORMATTER = _EscapingFormatter()


@functools.lru_cache(maxsize=512)
def named_fields(template: str) -> frozenset[str]:
    """The fields a message template names (``{node}``, ``{failure.value}``: node, failure)."""
    try:
        parsed = list(Formatter().parse(template))
    except ValueError:
        return frozenset()
    return frozenset(re.split(r"[.\[]", name, maxsplit=1)[0] for _, name, _, _ in parsed if name)


def _safe(value: object) -> bool:
    """A value that reads as itself in a message, unescaped (the common case)."""
    if isinstance(value, str):
        return _plain(value, _BARE_IN_MESSAGE)
    return value is None or isinstance(value, int | float)


def message(template: str, fields: Mapping[str, Any]) -> str | None:
    """``template`` filled from ``fields``, each value escaped; None when it does not format."""
    if all(_safe(fields.get(name)) for name in named_fields(template)):
        # Nothing to escape: str.format_map, in C, rather than the escaping formatter's Python.
        try:
            return template.format_map(fields)
        except Exception:
            pass
    try:
        return _FORMATTER.vformat(template, (), fields)
    except Exception:
        return None


def timestamp(seconds: float) -> str:
    """Local time to the millisecond: ``2026-12-02 05:10:12.345``."""
    whole = int(seconds)
    millis = int((seconds - whole) * 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(whole)) + f".{millis:03d}"


def text_line(
    seconds: float,
    level: str,
    text: str,
    fields: Iterable[tuple[str, object]],
    stack: str | None = None,
) -> str:
    """One record as one line (and its traceback, if any, as lines indented under it).

    :param text: the message, already escaped (:func:`message`, :func:`message_value`).
    :param fields: the fields after the message, in order; None values are left out.
    :param stack: a traceback: each of its lines follows, behind ``  | ``, escaped, so none
        can pass for a record of its own.
    """
    parts = [timestamp(seconds), f"{level:<5}", text.rstrip()]
    for key, value in fields:
        if value is not None and _KEY.fullmatch(key):
            parts.append(f"{key}={field_value(value)}")
    line = " ".join(part for part in parts if part)
    if stack:
        for row in stack.rstrip("\n").split("\n"):
            line += "\n  | " + _unprintable_escaped(row)
    return line + "\n"
