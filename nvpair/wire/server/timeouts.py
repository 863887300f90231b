# -*- test-case-name: tests.wire.server.test_facade_head -*-
"""A facade connection's time bounds: the request head's, the idle one, the linger after a
refusal, and the abort of a close the client does not read (docs/request-path.md#the-facade).

Each is one timer armed and disarmed by its connection as its requests come and go; what a
bound's end means is the connection's (:class:`Bounded`).
"""

from __future__ import annotations

from typing import Protocol

from twisted.internet.interfaces import IDelayedCall, IReactorTime

from nvpair.common.deadlines import Deadline, Deadlines


class Bounded(Protocol):
    """The connection the bounds are kept for."""

    def close(self) -> None:
        """Close once what was written has gone out."""

    def abort(self) -> None:
        """Drop the connection at once."""

    def idle_expired(self) -> None:
        """The idle bound has passed since it was armed: close, unless something happened."""

    @property
    def last_read(self) -> float:
        """When a byte was last read (the clock's seconds)."""


def _cancel(timer: IDelayedCall | Deadline) -> None:
    if timer.active():
        timer.cancel()


class Timeouts:
    """The timers of one connection, each armed at most once at a time.

    :param head_timeout: seconds a request head may take from its first byte (0: no bound).
    :param idle: the listener's idle bound, shared by its connections (None: no bound): how
        long a connection may wait for its next request.
    """

    # One per connection: no per-instance dictionary (docs/performance.md#held-streams).
    __slots__ = (
        "_abort",
        "_clock",
        "_connection",
        "_head",
        "_head_timeout",
        "_idle",
        "_idle_deadlines",
        "_linger",
        "_linger_quiet",
        "_linger_until",
    )

    def __init__(
        self,
        connection: Bounded,
        clock: IReactorTime,
        head_timeout: float,
        idle: Deadlines | None,
    ) -> None:
        self._connection = connection
        self._clock = clock
        self._head_timeout = head_timeout
        self._idle_deadlines = idle
        self._head: IDelayedCall | None = None
        # The listener's shared deadline, or (asked again after activity) a timer of its own.
        self._idle: Deadline | IDelayedCall | None = None
        self._linger: IDelayedCall | None = None
        self._linger_until = 0.0
        self._linger_quiet = 0.0
        self._abort: IDelayedCall | None = None

    def arm_head(self) -> None:
        """A request head begins (or may begin now): it has ``head_timeout`` to be complete."""
        timeout = self._head_timeout
        if timeout > 0 and self._head is None:
            self._head = self._clock.callLater(timeout, self._head_too_slow)

    def disarm_head(self) -> None:
        if self._head is not None:
            _cancel(self._head)
            self._head = None

    def arm_idle(self) -> None:
        """Nothing is in flight: the connection may wait ``idle_timeout`` for its next byte."""
        deadlines = self._idle_deadlines
        if deadlines is not None and self._idle is None:
            self._idle = deadlines.add(self._idle_passed)

    def idle_in(self, seconds: float) -> None:
        """Ask again in ``seconds``: something happened since the idle bound was armed."""
        self._idle = self._clock.callLater(seconds, self._idle_passed)

    def disarm_idle(self) -> None:
        idle = self._idle
        if idle is not None:
            self._idle = None
            _cancel(idle)

    def linger(self, seconds: float, quiet: float) -> None:
        """Close in ``seconds`` at the latest, and once ``quiet`` seconds pass with nothing read
        (a refused body being read and dropped): nginx's ``lingering_time`` and
        ``lingering_timeout``. One timer, looked at again when it fires rather than pushed back
        at every read."""
        self._linger_until = self._clock.seconds() + seconds
        self._linger_quiet = quiet
        self._linger = self._clock.callLater(min(seconds, quiet), self._linger_passed)

    def abort_in(self, seconds: float) -> None:
        """Abort in ``seconds`` unless the connection is gone by then (a close under way)."""
        if self._abort is None:
            self._abort = self._clock.callLater(seconds, self._abort_now)

    def cancel(self) -> None:
        """The connection is gone: no bound is kept for it any more."""
        for timer in (self._head, self._idle, self._linger, self._abort):
            if timer is not None:
                _cancel(timer)
        self._head = self._idle = self._linger = self._abort = None

    def _head_too_slow(self) -> None:
        self._head = None
        self._abort_now()

    def _idle_passed(self) -> None:
        self._idle = None
        self._connection.idle_expired()

    def _linger_passed(self) -> None:
        connection = self._connection
        left = min(self._linger_until, connection.last_read + self._linger_quiet)
        left -= self._clock.seconds()
        if left > 0:
            self._linger = self._clock.callLater(left, self._linger_passed)
            return
        self._linger = None
        connection.close()

    def _abort_now(self) -> None:
        self._abort = None
        self._connection.abort()
