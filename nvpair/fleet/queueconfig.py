"""The fleet file's ``[queue]`` and ``[nodes.parallel]``, read and checked
(docs/fleet-scheduling.md#the-queue). Each problem names its key; the fleet file adds its own
name (:mod:`nvpair.fleet.file`)."""

from __future__ import annotations

from collections.abc import Mapping

from nvpair.common.durations import parse_duration
from nvpair.control.fairqueue import DEFAULT_QUEUE, QueueOptions
from nvpair.engines.table import ENGINES

#: The most requests one engine is said to serve at once, and the deepest queue taken.
MAX_PARALLEL = 4096
MAX_DEPTH = 1_000_000


def _fail(where: str, why: str) -> ValueError:
    return ValueError(f"{where}: {why}")


def parse_parallel(where: str, table: object, engines: Mapping[str, str]) -> dict[str, int]:
    """A node's ``[nodes.parallel]``: engine = requests it serves at once per model."""
    if not isinstance(table, dict):
        raise _fail(where, "must be a table of engine = number, e.g. ollama = 4")
    parallel: dict[str, int] = {}
    for engine, value in table.items():
        if engine not in ENGINES:
            raise _fail(
                f"{where}.{engine}",
                f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}",
            )
        if engine not in engines:
            raise _fail(f"{where}.{engine}", f"the node has no engines.{engine} URL")
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARALLEL:
            raise _fail(f"{where}.{engine}", f"must be an integer in 1-{MAX_PARALLEL}")
        parallel[engine] = value
    return parallel


def _seconds(where: str, value: object, default: float) -> float:
    if value is None:
        return default
    try:
        seconds = parse_duration(value) if isinstance(value, str) else -1.0
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise _fail(where, 'must be a positive duration such as "10s"')
    return seconds


def parse_queue(table: object) -> QueueOptions:
    """``[queue]``: whether requests wait in the proxy, and its bounds."""
    if not isinstance(table, dict):
        raise _fail("queue", "must be a table")
    unknown = sorted(set(table) - {"enabled", "max-wait", "max-depth", "collate"})
    if unknown:
        raise _fail("queue", f"unknown key(s) {', '.join(unknown)}")
    enabled = table.get("enabled", DEFAULT_QUEUE.enabled)
    if not isinstance(enabled, bool):
        raise _fail("queue.enabled", "must be true or false")
    depth = table.get("max-depth", DEFAULT_QUEUE.max_depth)
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
        raise _fail("queue.max-depth", f"must be an integer in 1-{MAX_DEPTH}")
    return QueueOptions(
        enabled,
        _seconds("queue.max-wait", table.get("max-wait"), DEFAULT_QUEUE.max_wait),
        depth,
        _seconds("queue.collate", table.get("collate"), DEFAULT_QUEUE.collate),
    )
