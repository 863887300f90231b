"""Failed keys, counted per source address in a sliding window (docs/lan.md#failed-keys).

After :data:`FAILURES` failed keys within :data:`WINDOW` seconds an address is refused (429
``too-many-auth-failures``, with ``Retry-After``) until the oldest of them is out of the
window, whatever key it presents then: guessing a key costs a LAN machine at most ten tries a
minute. The caller says what an address is: an IPv6 host counts by its /64, which it can rotate
through freely (:func:`nvpair.wire.trust.connbounds.source_of`).

Memory is bounded: at most ``addresses`` addresses are remembered. One still counting its
failures may be forgotten (the one whose last failure is oldest first) to make room; a closed
one never is before its window ends, whatever fails elsewhere. When every remembered address
is closed, the failures of addresses there is no room for count together, and ten of them
within the window close every address not remembered, until that window ends.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from typing import Generic, TypeVar

from twisted.internet.interfaces import IReactorTime

#: Failed keys from one address that close it.
FAILURES = 10

#: The window they count in, in seconds.
WINDOW = 60.0

#: Addresses remembered at most.
ADDRESSES = 4096

A = TypeVar("A")


class FailedKeys(Generic[A]):
    """Failed keys per address, on ``clock`` (a :class:`~twisted.internet.task.Clock` in
    tests)."""

    def __init__(
        self,
        clock: IReactorTime,
        failures: int = FAILURES,
        window: float = WINDOW,
        addresses: int = ADDRESSES,
    ) -> None:
        self._clock = clock
        self._failures = failures
        self._window = window
        self._addresses = addresses
        # Addresses still counting: the times of their failures in the window, oldest first;
        # the address whose last failure is oldest first.
        self._counting: OrderedDict[A, deque[float]] = OrderedDict()
        # Closed addresses, with their failures in the window: each opens again when its
        # oldest is out of the window, and counts on from the rest.
        self._closed: dict[A, deque[float]] = {}
        # The failures of addresses there was no room for, and when they opened again.
        self._overflow: deque[float] = deque(maxlen=failures)
        self._overflow_until = -math.inf

    def __len__(self) -> int:
        return len(self._counting) + len(self._closed)

    def failed(self, address: A) -> None:
        """``address`` presented a key that is none of the file's."""
        now = self._clock.seconds()
        if self.retry_after(address) is not None:
            return  # refused before its key was looked at; nothing more to count
        times = self._counting.pop(address, None)
        if times is None:
            if not self._room(now):
                self._overflow_failed(now)
                return
            times = deque(maxlen=self._failures)
        times.append(now)
        while times[0] + self._window <= now:
            times.popleft()
        if len(times) == self._failures:
            self._closed[address] = times
        else:
            self._counting[address] = times

    def _room(self, now: float) -> bool:
        """Whether one more address can be remembered, forgetting one still counting if it
        must; never a closed one before its window ends."""
        if len(self) < self._addresses:
            return True
        window = self._window
        for address in [a for a, times in self._closed.items() if times[0] + window <= now]:
            del self._closed[address]
        if len(self) < self._addresses:
            return True
        if self._counting:
            self._counting.popitem(last=False)
            return True
        return False

    def _overflow_failed(self, now: float) -> None:
        overflow = self._overflow
        overflow.append(now)
        while overflow[0] + self._window <= now:
            overflow.popleft()
        if len(overflow) == self._failures:
            self._overflow_until = overflow[0] + self._window
            overflow.clear()

    def retry_after(self, address: A) -> int | None:
        """Whole seconds (at least 1) until ``address`` may present a key again, or None
        when it may now."""
        now = self._clock.seconds()
        closed = self._closed.get(address)
        if closed is not None:
            if closed[0] + self._window > now:
                return max(1, math.ceil(closed[0] + self._window - now))
            # Open again: its other failures still count, in the window they were made in.
            del self._closed[address]
            self._counting[address] = closed
        times = self._counting.get(address)
        if times is not None:
            while times and times[0] + self._window <= now:
                times.popleft()
            if not times:
                del self._counting[address]
            return None
        if self._overflow_until > now:
            return max(1, math.ceil(self._overflow_until - now))
        return None
