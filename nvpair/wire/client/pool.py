# -*- test-case-name: tests.wire.client.test_upstream -*-
"""Idle upstream connections, kept per ``(scheme, host, port)`` between exchanges.

A list per key, newest last: the newest is handed out first, the oldest is the first to go
when the list is full or has been idle too long. Only what the pool keeps is its business,
and a connection knows nothing of it; dialling is :mod:`nvpair.wire.client.upstream`'s, one
exchange on a connection :mod:`nvpair.wire.client.connection`'s.
"""

from __future__ import annotations

from functools import partial

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Factory

from nvpair.wire.client.connection import UpstreamConnection
from nvpair.wire.client.types import Key

#: Idle connections kept per upstream. Twisted's default of 2 limits the idle cache, not
#: concurrency, and halved throughput in a measurement.
MAX_PERSISTENT_PER_HOST = 64

#: Seconds an idle connection is kept (Twisted's ``cachedConnectionTimeout``).
IDLE_TIMEOUT = 240.0


class Pool:
    """Idle connections per ``(scheme, host, port)``: the newest is used first, at most
    :data:`MAX_PERSISTENT_PER_HOST` are kept, and one idle for :data:`IDLE_TIMEOUT` closes.

    It limits the idle set, not concurrency: a request that finds none dials a new one. One
    timer sweeps the whole pool, armed only while something is idle. The pool owns its
    connections one way: it makes them (:meth:`factory`), is told when one can carry another
    exchange (:meth:`keep`, each connection's ``quiescent``, which names where it leads), and
    keeps since when each is idle itself. A connection lost while idle is found out when it is
    next taken or swept.

    :ivar retired: connections coming back are closed instead of kept.
    """

    def __init__(self, clock: IReactorTime, max_idle: int, idle_timeout: float) -> None:
        self._clock = clock
        self._max = max_idle
        self._timeout = idle_timeout
        #: Idle connections per key, oldest first, each with when it went idle.
        self._idle: dict[Key, list[tuple[float, UpstreamConnection]]] = {}
        self._timer: IDelayedCall | None = None
        self.retired = False

    def factory(self, key: Key) -> ConnectionFactory:
        """What dials a connection to ``key`` for this pool."""
        return ConnectionFactory(self, key)

    def take(self, key: Key) -> UpstreamConnection | None:
        """The newest idle connection to ``key`` that can still carry a request, or None."""
        idle = self._idle.get(key)
        while idle:
            _, connection = idle.pop()
            if connection.ready():
                return connection
        return None

    def keep(self, key: Key, connection: UpstreamConnection) -> None:
        """``connection`` to ``key`` ended its exchange cleanly: keep it for another, or close
        it."""
        if self.retired:
            connection.close()
            return
        idle = self._idle.get(key)
        if idle is None:
            idle = self._idle[key] = []
        elif len(idle) >= self._max:
            _, oldest = idle.pop(0)
            oldest.close()
        idle.append((self._clock.seconds(), connection))
        if self._timer is None:
            self._timer = self._clock.callLater(self._timeout, self._sweep)

    def _sweep(self) -> None:
        self._timer = None
        cutoff = self._clock.seconds() - self._timeout
        next_due: float | None = None
        for key, idle in list(self._idle.items()):
            # Oldest first: each list is in the order its connections went idle; one lost
            # meanwhile goes too.
            kept = []
            for since, connection in idle:
                if since <= cutoff or not connection.ready():
                    connection.close()
                else:
                    kept.append((since, connection))
            if not kept:
                del self._idle[key]
                continue
            self._idle[key] = kept
            oldest, _ = kept[0]
            if next_due is None or oldest < next_due:
                next_due = oldest
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
            closing.extend(connection.close() for _, connection in connections)
        return defer.gatherResults(closing).addCallback(lambda _: None)

    def retire(self) -> Deferred[None]:
        """Close the idle connections now and every busy one once its exchange ends."""
        self.retired = True
        return self.close_idle()


class ConnectionFactory(Factory):
    """Builds a pool's :class:`~nvpair.wire.client.connection.UpstreamConnection`s to one key."""

    # One dial per connection: at Twisted's default every one would log "Starting factory".
    noisy = False

    def __init__(self, pool: Pool, key: Key) -> None:
        self._pool = pool
        self._key = key

    def buildProtocol(self, addr: object) -> UpstreamConnection:
        return UpstreamConnection(partial(self._pool.keep, self._key))
