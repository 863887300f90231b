# -*- test-case-name: tests.wire.test_upstream -*-
"""Idle upstream connections, kept per ``(scheme, host, port)`` between exchanges.

A list per key, newest last: the newest is handed out first, the oldest is the first to go
when the list is full or has been idle too long. Only what the pool keeps is its business;
dialling is :mod:`nvpair.wire.upstream`'s, one exchange on a connection
:mod:`nvpair.wire.upstream_conn`'s.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from nvpair.wire.message import Answer
from nvpair.wire.upstream_conn import UpstreamConnection
from nvpair.wire.upstream_types import Key, Payload, Resent

#: Idle connections kept per upstream. Twisted's default of 2 limits the idle cache, not
#: concurrency, and halved throughput in a measurement.
MAX_PERSISTENT_PER_HOST = 64

#: Seconds an idle connection is kept (Twisted's ``cachedConnectionTimeout``).
IDLE_TIMEOUT = 240.0

#: How a pool has a request sent again on a fresh connection: ``(pool, key, head, data,
#: deferred)``, as :meth:`~nvpair.wire.upstream_conn.Owner.resend`.
Redial = Callable[["Pool", Key, bool, Payload, Deferred[Answer]], Resent]


class Pool:
    """Idle connections per ``(scheme, host, port)``: the newest is used first, at most
    :data:`MAX_PERSISTENT_PER_HOST` are kept, and one idle for :data:`IDLE_TIMEOUT` closes.

    It limits the idle set, not concurrency: a request that finds none dials a new one. One
    timer sweeps the whole pool, armed only while something is idle.

    :ivar retired: connections coming back are closed instead of kept.
    """

    def __init__(
        self, clock: IReactorTime, max_idle: int, idle_timeout: float, redial: Redial
    ) -> None:
        self._clock = clock
        self._redial = redial
        self._max = max_idle
        self._timeout = idle_timeout
        self._idle: dict[Key, list[UpstreamConnection]] = {}
        self._timer: IDelayedCall | None = None
        self.retired = False

    def adopt(self, connection: UpstreamConnection, key: Key) -> None:
        """A freshly dialled connection joins this pool (it is busy)."""
        connection.owner = self
        connection.key = key

    def take(self, key: Key) -> UpstreamConnection | None:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if connection.unpark():
                return connection
        return None

    def put(self, connection: UpstreamConnection) -> None:
        if self.retired:
            connection.close()
            return
        idle = self._idle.get(connection.key)
        if idle is None:
            idle = self._idle[connection.key] = []
        elif len(idle) >= self._max:
            idle.pop(0).close()
        connection.park(self._clock.seconds())
        idle.append(connection)
        if self._timer is None:
            self._timer = self._clock.callLater(self._timeout, self._sweep)

    def resend(self, key: Key, head: bool, data: Payload, deferred: Deferred[Answer]) -> Resent:
        """A connection it handed out went before answering: dial again, into this pool."""
        return self._redial(self, key, head, data, deferred)

    def drop(self, connection: UpstreamConnection) -> None:
        idle = self._idle.get(connection.key)
        if idle is not None and connection in idle:
            idle.remove(connection)
            if not idle:
                del self._idle[connection.key]

    def _sweep(self) -> None:
        self._timer = None
        cutoff = self._clock.seconds() - self._timeout
        next_due: float | None = None
        for key, idle in list(self._idle.items()):
            # Oldest first: each list is in the order its connections went idle.
            while idle and idle[0].idle_since <= cutoff:
                idle.pop(0).close()
            if not idle:
                del self._idle[key]
            elif next_due is None or idle[0].idle_since < next_due:
                next_due = idle[0].idle_since
        if next_due is not None:
            delay = max(next_due + self._timeout - self._clock.seconds(), 0.0)
            self._timer = self._clock.callLater(delay, self._sweep)

    def close_idle(self) -> Deferred[None]:
        """Close every idle connection; fires once all are closed."""
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None
        closing: list[Deferred[None]] = []
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            closing.extend(connection.close() for connection in connections)
        return defer.gatherResults(closing).addCallback(lambda _: None)

    def retire(self) -> Deferred[None]:
        """Close the idle connections now and every busy one once its exchange ends."""
        self.retired = True
        return self.close_idle()
