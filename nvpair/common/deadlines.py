# -*- test-case-name: tests.common.test_deadlines -*-
"""Many timers of one duration on one reactor timer.

Some bounds are armed and disarmed on every request with the same duration each time: an
attempt's header budget (armed at the dial, disarmed when the head comes), a kept-alive
connection's idle bound (disarmed when a request comes, armed again at its answer). A reactor
timer for each costs a ``DelayedCall``, a place in the reactor's heap and its removal, some
16,000 instructions per timer that lives across a reactor turn
(docs/performance.md#timers). :class:`Deadlines` keeps such deadlines in a dictionary instead
(an entry added and removed for a few hundred instructions) and one reactor timer for the
earliest of them, moved only when it fires: with requests coming and going, about once per
duration, whatever the rate.

Each deadline still fires when it is due, as a timer of its own would: the reactor timer is
never later than the earliest deadline pending (one armed anew only for a deadline earlier than
it, as a clock set back could make).
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger


class Deadline:
    """One deadline of a :class:`Deadlines`: cancel it, or let it fire."""

    # One per attempt or idle connection: no per-instance dictionary.
    __slots__ = ("_expired", "_queue", "at")

    def __init__(self, queue: Deadlines, at: float, expired: Callable[[], None]) -> None:
        self._queue: Deadlines | None = queue
        #: When it is due, on the queue's clock.
        self.at = at
        self._expired = expired

    def active(self) -> bool:
        """Neither fired nor cancelled."""
        return self._queue is not None

    def cancel(self) -> None:
        """It will not fire (nothing when it already has, or was cancelled)."""
        queue, self._queue = self._queue, None
        if queue is not None:
            queue.forget(self)


class Deadlines:
    """Deadlines of ``seconds`` each, on one timer of ``clock``'s.

    :param clock: the reactor (or a test's ``Clock``).
    :param seconds: how long after :meth:`add` each deadline is due.
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, seconds: float) -> None:
        self._clock = clock
        self._seconds = seconds
        # Pending deadlines, as an ordered set: added and removed in constant time, the
        # earliest nearly always first (one duration for all, on a clock that goes forward).
        self._pending: dict[Deadline, None] = {}
        self._timer: IDelayedCall | None = None
        self._timer_at = 0.0

    def add(self, expired: Callable[[], None]) -> Deadline:
        """Call ``expired`` ``seconds`` from now, unless the deadline returned is cancelled."""
        clock = self._clock
        at = clock.seconds() + self._seconds
        deadline = Deadline(self, at, expired)
        self._pending[deadline] = None
        timer = self._timer
        if timer is None or at < self._timer_at:
            if timer is not None:
                timer.cancel()
            self._arm(at)
        return deadline

    def forget(self, deadline: Deadline) -> None:
        """``deadline`` will not fire: the reactor timer stays, and finds it gone."""
        self._pending.pop(deadline, None)

    def __len__(self) -> int:
        """Deadlines pending."""
        return len(self._pending)

    def _arm(self, at: float) -> None:
        self._timer_at = at
        self._timer = self._clock.callLater(max(0.0, at - self._clock.seconds()), self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = self._clock.seconds()
        pending = self._pending
        due = [deadline for deadline in pending if deadline.at <= now]
        later = [deadline.at for deadline in pending if deadline.at > now]
        if later:
            self._arm(min(later))
        for deadline in due:
            if deadline._queue is None:
                continue  # cancelled by a callback before it
            del pending[deadline]
            deadline._queue = None
            try:
                deadline._expired()
            except Exception:
                # As the reactor does for a timer of its own: logged, and the others still fire.
                self.log.failure("a deadline's callback failed")
