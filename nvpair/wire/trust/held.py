"""A new connection held until something about it is known, then handed to a delegate.

What the first-byte sniffer (:mod:`nvpair.wire.trust.sniffing`) and the TLS sorter
(:mod:`nvpair.wire.trust.lantls`) each are before they know where a connection goes. Its own module
so that neither of those imports the other for it: the sniffer loads TLS only once a TLS byte
comes (docs/performance.md#memory), and the sorter needs nothing of the sniffer.
"""

from __future__ import annotations

from twisted.internet.interfaces import IAddress, IDelayedCall, IProtocol, IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure


class Held(Protocol):
    """A new connection held until something about it is known, within ``timeout`` seconds
    (else aborted), then handed to a delegate with the real transport."""

    def __init__(self, clock: IReactorTime, timeout: float, address: IAddress) -> None:
        self._clock = clock
        self._timeout = timeout
        self._address = address
        self._delegate: IProtocol | None = None
        self._timer: IDelayedCall | None = None

    def connectionMade(self) -> None:
        self._timer = self._clock.callLater(self._timeout, self.abort)

    def _disarm(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def abort(self) -> None:
        """Close the connection at once, unanswered."""
        self._disarm()
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    def hand_over(self, delegate: IProtocol | None) -> bool:
        """Give the connection to ``delegate`` (None: close it); whether it was given."""
        self._disarm()
        transport = self.transport
        assert transport is not None
        if delegate is None:
            transport.loseConnection()
            return False
        self._delegate = delegate
        delegate.makeConnection(transport)
        return True

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._disarm()
        if self._delegate is not None:
            self._delegate.connectionLost(reason)
