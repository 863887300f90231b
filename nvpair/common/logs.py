"""Logs: JSON lines on stderr, or text lines for a person, a level that changes live, nothing
on the never-log list (docs/README.md#logging).

Every record carries ``component: nvpair-proxy`` (docs/README.md#logging: at process init there is
no engine to name) and, for facade records, the ``engine`` field its emitter passed. Only
operational fields reach the line: scalar values the emitter named. Request and response content is
never passed to a logger anywhere in the process, and this observer adds a second guard by dropping
any field that is not a plain scalar, so a body handed in by mistake never lands in a line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import IO, Any

from twisted.logger import (
    ILogObserver,
    LogLevel,
    formatEvent,
)
from zope.interface import implementer

from nvpair.common import logtext

COMPONENT = "nvpair-proxy"

#: The level names (docs/README.md#logging), mapped onto Twisted's levels.
LEVELS: dict[str, LogLevel] = {
    "debug": LogLevel.debug,
    "info": LogLevel.info,
    "warn": LogLevel.warn,
    "error": LogLevel.error,
}

_LEVEL_NAMES = {
    LogLevel.debug: "debug",
    LogLevel.info: "info",
    LogLevel.warn: "warn",
    LogLevel.error: "error",
    LogLevel.critical: "error",
}

# Longest string field we copy into a line. Operational values (ids, paths, error text) are
# short; a long one is far more likely to be content that slipped in than metadata.
_MAX_FIELD = 512


class _DebugGate:
    """Whether a debug record would be written at all.

    Twisted builds and publishes every event before any observer can drop it (about 20 µs a
    call here); the per-request path asks this first, so debug logging costs nothing while
    the level is above debug.
    """

    enabled = False


_DEBUG = _DebugGate()


def debug_enabled() -> bool:
    """Cheap check for the hot path: is the live level debug?"""
    return _DEBUG.enabled


def parse_level(name: str) -> LogLevel:
    """The LogLevel for a level name; ValueError naming the accepted ones."""
    try:
        return LEVELS[name]
    except KeyError:
        raise ValueError(
            f"unknown log level {name!r}; expected one of {', '.join(LEVELS)}"
        ) from None


#: ``--log-format``: ``auto`` is text when the log goes to a terminal, JSON otherwise.
LOG_FORMATS = ("auto", "text", "json")


def parse_log_format(name: str) -> str:
    """A ``--log-format`` value; ValueError naming the accepted ones."""
    if name not in LOG_FORMATS:
        raise ValueError(f"unknown log format {name!r}; expected one of {', '.join(LOG_FORMATS)}")
    return name


def chosen_format(name: str, out: IO[str]) -> str:
    """``text`` or ``json``: ``auto`` is text for a person at a terminal, and JSON for whatever
    else reads the stream (systemd's journal, a pipe, the broker)."""
    if name != "auto":
        return name
    try:
        return "text" if out.isatty() else "json"
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return "json"


#: What a record says of itself; an event's own field of one of these names is not copied.
_OWN = frozenset({"time", "level", "component", "namespace", "msg"})
#: Fields of twisted.python.log's events that say nothing to a person reading text.
_LEGACY = frozenset({"system", "isError"})


def _operational(event: dict[str, Any]) -> dict[str, object]:
    """The fields that may reach a line: scalars and short strings the emitter named."""
    fields: dict[str, object] = {}
    for key, value in event.items():
        if key[:4] == "log_" or key[:1] == "_" or key in _OWN:
            continue
        # bool is an int; tuples, not unions: isinstance is measurably faster with them.
        if (
            value is None
            or isinstance(value, (int, float))
            or (isinstance(value, str) and len(value) <= _MAX_FIELD)
        ):
            fields[key] = value
    return fields


def _stray_text(event: dict[str, Any]) -> str:
    # Twisted routes stray writes to sys.stdout/stderr here; keep a bounded excerpt so a
    # library's noise is visible without trusting its size.
    return str(event["log_io"])[:_MAX_FIELD] if "log_io" in event else ""


def _formatted(template: str, event: dict[str, Any]) -> str:
    """The event's message: str.format_map (in C) when it can, else Twisted's own formatting
    (its ``{method()}`` calls, its words for an event that does not format)."""
    try:
        return template.format_map(event)
    except Exception:
        return formatEvent(event)


Readable = Callable[[dict[str, Any]], dict[str, Any] | None]


@implementer(ILogObserver)
class LogObserver:
    """Writes each event at or above :attr:`level` as one line: a JSON object, or text for a
    person (:mod:`nvpair.common.logtext`).

    :param out: a text stream (stderr); flushed per line so a crash loses nothing.
    :param level: the initial minimum level; :meth:`set_level` changes it live.
    :param text: write text lines rather than JSON.
    :param readable: rewords or drops (None) an event before it is written: Twisted's own
        lines (:class:`nvpair.common.twistedlines.TwistedLines`).
    """

    def __init__(
        self,
        out: IO[str],
        level: LogLevel = LogLevel.info,
        *,
        text: bool = False,
        readable: Readable | None = None,
    ) -> None:
        self._out = out
        self._render = self._text if text else self._json
        self._readable = readable
        self.level = level
        _DEBUG.enabled = level <= LogLevel.debug

    def set_level(self, level: LogLevel) -> None:
        self.level = level
        _DEBUG.enabled = level <= LogLevel.debug

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("log_level", LogLevel.info) < self.level:
            return
        if self._readable is not None:
            reworded = self._readable(event)
            if reworded is None or reworded.get("log_level", LogLevel.info) < self.level:
                return
            event = reworded
        self._out.write(self._render(event))
        self._out.flush()

    @staticmethod
    def _json(event: dict[str, Any]) -> str:
        record: dict[str, object] = {
            "time": round(event.get("log_time") or time.time(), 3),
            "level": _LEVEL_NAMES.get(event.get("log_level", LogLevel.info), "info"),
            "component": COMPONENT,
        }
        namespace = event.get("log_namespace")
        if namespace:
            record["namespace"] = namespace
        record.update(_operational(event))
        template = event.get("log_format")
        text = "" if template is None else _formatted(template, event)
        record["msg"] = text or _stray_text(event)
        failure = event.get("log_failure")
        if failure is not None:
            record["error"] = str(failure.getErrorMessage())[:_MAX_FIELD]
            record["stack"] = failure.getTraceback()
        return json.dumps(record, default=str, separators=(",", ":")) + "\n"

    @staticmethod
    def _text(event: dict[str, Any]) -> str:
        template = event.get("log_format")
        named: frozenset[str] = frozenset()
        text = None
        if template is not None:
            named = logtext.named_fields(template)
            text = logtext.message(template, event)
            if text is None:  # Twisted's own words for an event that does not format
                text = logtext.message_value(formatEvent(event))
        if not text:
            stray = _stray_text(event)
            text = logtext.message_value(stray) if stray else ""
        failure = event.get("log_failure")
        # A failure's own message is the record's error, as in JSON.
        hidden = named | _LEGACY | ({"error", "stack"} if failure is not None else set())
        fields = [(key, value) for key, value in _operational(event).items() if key not in hidden]
        stack = None
        if failure is not None:
            fields.append(("error", str(failure.getErrorMessage())[:_MAX_FIELD]))
            stack = failure.getTraceback()
        level = _LEVEL_NAMES.get(event.get("log_level", LogLevel.info), "info")
        return logtext.text_line(event.get("log_time") or time.time(), level, text, fields, stack)
