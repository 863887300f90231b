"""Structured logs: JSON lines on stderr, a level that changes live, nothing on the never-log list
(docs/README.md#logging).

Every record carries ``component: nvpair-proxy`` (docs/README.md#logging: at process init there is
no engine to name) and, for facade records, the ``engine`` field its emitter passed. Only
operational fields reach the line: scalar values the emitter named. Request and response content is
never passed to a logger anywhere in the process, and this observer adds a second guard by dropping
any field that is not a plain scalar, so a body handed in by mistake never lands in a line.
"""

from __future__ import annotations

import json
import time
from typing import IO, Any

from twisted.logger import (
    ILogObserver,
    LogLevel,
    formatEvent,
)
from zope.interface import implementer

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


@implementer(ILogObserver)
class JsonLineObserver:
    """Writes each event at or above :attr:`level` as one JSON object per line.

    :param out: a text stream (stderr); flushed per line so a crash loses nothing.
    :param level: the initial minimum level; :meth:`set_level` changes it live.
    """

    def __init__(self, out: IO[str], level: LogLevel = LogLevel.info) -> None:
        self._out = out
        self.level = level
        _DEBUG.enabled = level <= LogLevel.debug

    def set_level(self, level: LogLevel) -> None:
        self.level = level
        _DEBUG.enabled = level <= LogLevel.debug

    def __call__(self, event: dict[str, Any]) -> None:
        level = event.get("log_level", LogLevel.info)
        if level < self.level:
            return
        record: dict[str, object] = {
            "time": round(event.get("log_time", time.time()), 3),
            "level": _LEVEL_NAMES.get(level, "info"),
            "component": COMPONENT,
        }
        namespace = event.get("log_namespace")
        if namespace:
            record["namespace"] = namespace
        for key, value in event.items():
            if key.startswith("log_") or key.startswith("_") or key in record:
                continue
            scalar = isinstance(value, bool | int | float) or value is None
            if scalar or (isinstance(value, str) and len(value) <= _MAX_FIELD):
                record[key] = value
        text = formatEvent(event) if event.get("log_format") is not None else ""
        if not text and "log_io" in event:
            # Twisted routes stray writes to sys.stdout/stderr here; keep a bounded excerpt so a
            # library's noise is visible without trusting its size.
            text = str(event["log_io"])[:_MAX_FIELD]
        record["msg"] = text
        failure = event.get("log_failure")
        if failure is not None:
            record["error"] = str(failure.getErrorMessage())[:_MAX_FIELD]
            record["stack"] = failure.getTraceback()
        self._out.write(json.dumps(record, default=str, separators=(",", ":")) + "\n")
        self._out.flush()
