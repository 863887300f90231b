"""Writing to a TCP connection now rather than at the reactor's next turn
(docs/performance.md#writes-go-out-at-once).

A Twisted TCP transport never writes in ``write()``: it appends to a buffer and asks the
reactor for write interest, and the reactor sends at its next turn, then drops the interest
again. For a proxy that is two ``epoll_ctl`` calls and one extra reactor turn per write, and a
request is two writes (the request upstream, the answer to the client): measured, half of the
reactor's turns per request. :func:`send` sends at once when nothing is queued ahead, the way
asyncio's transports do, and leaves whatever the kernel did not take to the transport's own
buffer, which then works as always: write interest, backpressure to a registered producer, the
close after the last byte.

It reads the transport's buffer state, which Twisted keeps in attributes of
:class:`twisted.internet.abstract.FileDescriptor` that are not public API; a test pins them
(``tests/test_wire.py``), so a Twisted that changes them fails the suite rather than reorders
bytes. Any other transport (TLS, in-memory, a test's) is written to as usual.
"""

from __future__ import annotations

from typing import Protocol

from twisted.internet import tcp

_TCP = tcp.Connection


class Writable(Protocol):
    def write(self, data: bytes) -> None: ...


def send(transport: Writable, data: bytes) -> None:
    """``transport.write(data)``, sent now when it is a plain TCP connection with nothing
    queued ahead of ``data``."""
    if (
        isinstance(transport, _TCP)
        and not transport.TLS
        and transport.connected
        and not transport.disconnecting
        and not transport._writeDisconnected
        and not transport._tempDataLen
        and transport.offset == len(transport.dataBuffer)
    ):
        try:
            sent = transport.socket.send(data)
        except OSError:
            # Would block, or the connection is failing: queued as usual, and the reactor's
            # next write attempt meets the same error and closes the connection its own way.
            sent = 0
        if sent == len(data):
            return
        data = data[sent:]
    transport.write(data)
