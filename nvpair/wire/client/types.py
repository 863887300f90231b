# -*- test-case-name: tests.wire.client.test_upstream_conn -*-
"""What the upstream client's modules say to each other: where a connection leads (:data:`Key`),
where it is (:class:`Phase`), and the seams between a connection, its transport, its pool and
the body read over it. Names and protocols only.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol

from twisted.internet.defer import Deferred

from nvpair.wire.message import Answer

#: ``(scheme, host, port)``: which idle connections may carry a request.
Key = tuple[bytes, bytes, int]


class Phase(enum.Enum):
    """Where a connection is. Each exchange goes READY → WAITING_HEAD → READING_BODY →
    BODY_DONE, then READY for the next (kept by whoever keeps it), or CLOSING → CLOSED."""

    READY = "ready"  # connected, nothing asked
    WAITING_HEAD = "waiting-head"  # a request written; 1xx answers pass, the final head not yet
    READING_BODY = "reading-body"  # the final head parsed; its body being read
    BODY_DONE = "body-done"  # the body ended by its framing in this read, not yet settled
    CLOSING = "closing"  # being closed: no exchange starts on it again
    CLOSED = "closed"


#: A request as it is written: its bytes; or, with a large body, its head and its body, so
#: that the body goes out from where it is, never copied behind its head
#: (docs/robustness.md#what-a-request-body-costs).
Payload = bytes | tuple[bytes, bytes]

#: Cancels a request sent again on a fresh connection, given its Deferred.
Resent = Callable[[Deferred[Answer]], None]


class BodyOwner(Protocol):
    """What an engine's answer's body stops: the connection it is read from."""

    def stop_body(self, abort: bool = False) -> None: ...


class Wire(Protocol):
    """What an upstream connection uses of its transport (TCP, or TLS over it); a
    :class:`~nvpair.wire.client.body.ReadFlow` pauses and resumes it."""

    def write(self, data: bytes) -> None: ...

    def loseConnection(self) -> None: ...

    def abortConnection(self) -> None: ...

    def pauseProducing(self) -> None: ...

    def resumeProducing(self) -> None: ...
