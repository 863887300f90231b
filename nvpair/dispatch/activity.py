"""``discovery:node-activity``: this process's in-flight count toward each node, coalesced.

A burst of dispatches changes a node's count many times a millisecond; the broker needs the
current figure, not each step, so each (engine, node) reports at most every
:data:`MIN_INTERVAL` seconds and always ends on the latest value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from types import MappingProxyType

from twisted.internet.interfaces import IDelayedCall, IReactorTime

#: At most ~10 reports per second per node (docs/broker-protocol.md).
MIN_INTERVAL = 0.1

Emit = Callable[[str, dict[str, object]], None]


class NodeActivity:
    """Counts in-flight dispatches per (engine, node) and reports changes, coalesced.

    :param wanted: whether anyone consumes the reports now; when not (fleet mode below debug
        level), only the counts are kept: no report is built and no coalescing timer armed.
    """

    def __init__(
        self, clock: IReactorTime, emit: Emit, wanted: Callable[[], bool] = lambda: True
    ) -> None:
        self._clock = clock
        self._emit = emit
        self._wanted = wanted
        self._counts: dict[tuple[str, str], int] = {}
        self._reported: dict[tuple[str, str], int] = {}
        self._last_sent: dict[tuple[str, str], float] = {}
        self._pending: dict[tuple[str, str], IDelayedCall] = {}

    def in_flight(self, engine: str, node: str) -> int:
        """This process's dispatches in flight to ``node``'s ``engine`` now."""
        return self._counts.get((engine, node), 0)

    def counts(self) -> Mapping[tuple[str, str], int]:
        """Every (engine, node) with dispatches in flight now, and how many."""
        return MappingProxyType(self._counts)

    def tracking(self, engine: str, node: str) -> AbstractContextManager[None]:
        """Count one dispatch toward ``node`` for the duration of the block."""
        return _Tracking(self._change, (engine, node))

    def _change(self, key: tuple[str, str], delta: int) -> None:
        count = self._counts.get(key, 0) + delta
        if count:
            self._counts[key] = count
        else:
            self._counts.pop(key, None)
        if key in self._pending or not self._wanted():
            return
        wait = self._last_sent.get(key, -MIN_INTERVAL) + MIN_INTERVAL - self._clock.seconds()
        if wait <= 0:
            self._send(key)
        else:
            self._pending[key] = self._clock.callLater(wait, self._flush, key)

    def _flush(self, key: tuple[str, str]) -> None:
        del self._pending[key]
        self._send(key)

    def _send(self, key: tuple[str, str]) -> None:
        count = self._counts.get(key, 0)
        if self._reported.get(key, 0) == count:
            return
        self._reported[key] = count
        self._last_sent[key] = self._clock.seconds()
        engine, node = key
        self._emit("discovery:node-activity", {"nodeId": node, "engine": engine, "inFlight": count})
        if not count:
            self._reported.pop(key, None)


class _Tracking:
    """One dispatch counted for the duration of a block. A class, not a generator under
    ``contextlib.contextmanager``: entered once per dispatch, where a generator-based
    manager costs a generator and several calls more
    (docs/performance.md#per-dispatch-overheads)."""

    __slots__ = ("_change", "_key")

    def __init__(
        self, change: Callable[[tuple[str, str], int], None], key: tuple[str, str]
    ) -> None:
        self._change = change
        self._key = key

    def __enter__(self) -> None:
        self._change(self._key, +1)

    def __exit__(self, *exc_info: object) -> None:
        self._change(self._key, -1)
