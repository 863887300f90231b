"""Failed keys, counted per source address in a sliding window (docs/lan.md#failed-keys).

After :data:`FAILURES` failed keys within :data:`WINDOW` seconds an address is refused (429
``too-many-auth-failures``, with ``Retry-After``) until the oldest of them is out of the
window, whatever key it presents then: guessing a key costs a LAN machine at most ten tries a
minute. Memory is bounded: at most ``FAILURES`` times per address, and at most ``addresses``
addresses, the one whose last failure is oldest forgotten first.
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
        # address -> the times of its last ``failures`` failed keys, oldest first; the
        # address whose last failure is oldest first.
        self._seen: OrderedDict[A, deque[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def failed(self, address: A) -> None:
        """``address`` presented a key that is none of the file's."""
        times = self._seen.pop(address, None)
        if times is None:
            times = deque(maxlen=self._failures)
            while len(self._seen) >= self._addresses:
                self._seen.popitem(last=False)
        times.append(self._clock.seconds())
        self._seen[address] = times

    def retry_after(self, address: A) -> int | None:
        """Whole seconds (at least 1) until ``address`` may present a key again, or None
        when it may now."""
        times = self._seen.get(address)
        if times is None:
            return None
        now = self._clock.seconds()
        while times and times[0] + self._window <= now:
            times.popleft()
        if not times:
            del self._seen[address]
            return None
        if len(times) < self._failures:
            return None
        return max(1, math.ceil(times[0] + self._window - now))
