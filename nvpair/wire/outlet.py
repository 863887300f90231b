# -*- test-case-name: tests.wire.test_outlet -*-
"""A connection's way out: writes sent now when nothing is queued ahead, and the backpressure
of what is queued (docs/performance.md#writes-go-out-at-once).

A Twisted TCP transport never writes in ``write()``: it appends to a buffer and asks the
reactor for write interest, and the reactor sends at its next turn, then drops the interest
again. For a proxy that is two ``epoll_ctl`` calls and one extra reactor turn per write, and a
request is two writes (the request upstream, the answer to the client). :meth:`Outlet.send`
sends at once when nothing is queued ahead, the way asyncio's transports do, and leaves what
the kernel did not take to the transport's own buffer.

Whether anything is queued ahead is this outlet's own account, kept through public interfaces
only: on a TCP transport it registers as a *pull* producer, which the transport asks for more
(``resumeProducing``) each time its buffer has drained, so "queued" is "bytes handed to
``write`` since the last drain". The same count gives the streaming backpressure Twisted gives a
push producer (pause past :data:`HIGH_WATER` bytes, resume once drained), passed on to the
connection's own producer. Any other transport (TLS, in-memory, a test's) is written to as usual
and its push-producer backpressure passed on unchanged.

While an upstream read is handled (:data:`GATHER`), what each outlet sends is gathered and
leaves in one send once the read has been handled, before the reactor runs anything else: a
stream's last piece and the chunked terminator its end writes are one send, not two
(docs/performance.md#one-send-per-read).
"""

from __future__ import annotations

import enum
import socket
from typing import Protocol, cast

from twisted.internet import tcp
from twisted.internet.interfaces import IPushProducer, ISystemHandle, ITransport
from zope.interface import implementer

#: Bytes queued past which the connection's producer is paused: Twisted's own
#: ``FileDescriptor.bufferSize`` for the same decision.
HIGH_WATER = 64 * 1024

#: What :meth:`Outlet.send_body` copies of a body at a time, when the kernel takes no more of
#: it for now and the transport's buffer is to hold the next piece.
WINDOW = 64 * 1024


class Producer(Protocol):
    """Whoever feeds the connection and slows down when it is full (a push producer)."""

    def pauseProducing(self) -> None: ...

    def resumeProducing(self) -> None: ...

    def stopProducing(self) -> None: ...


class _Transport(Protocol):
    """What an outlet uses of its transport."""

    disconnecting: bool | int

    def write(self, data: bytes) -> None: ...

    def loseConnection(self) -> None: ...

    def registerProducer(self, producer: object, streaming: bool) -> None: ...

    def unregisterProducer(self) -> None: ...


class Gathering:
    """Sends gathered while an upstream read is handled: ``with GATHER:`` around the handling,
    and only there (:meth:`nvpair.wire.client.connection.UpstreamConnection.dataReceived`). What
    any outlet sends meanwhile is held in it and leaves in one send as the block ends (see the
    module docstring).

    One per process, :data:`GATHER`, since the outlets a read writes to (the facade connection
    a relay answers on, say) are not the upstream connection's to know. A read handled inside
    another (in memory, a test's transports deliver at once) sends when the outermost ends.

    :ivar depth: reads being handled now; read by :meth:`Outlet.send`, changed only by
        entering and leaving.
    :ivar outlets: the outlets holding gathered bytes.
    """

    __slots__ = ("depth", "outlets")

    def __init__(self) -> None:
        self.depth = 0
        self.outlets: list[Outlet] = []

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc_info: object) -> None:
        self.depth -= 1
        if not self.depth and self.outlets:
            outlets, self.outlets = self.outlets, []
            for outlet in outlets:
                outlet.release()


#: Entered by the upstream connection's ``dataReceived`` (nvpair.wire.client.connection), only.
GATHER = Gathering()


class _Mode(enum.Enum):
    #: A plain TCP connection with nothing queued: a send goes to the kernel now.
    DIRECT = "direct"
    #: Bytes are queued ahead (or the transport is not plain TCP): writes go behind them.
    QUEUED = "queued"
    #: The connection is gone or closing: writes are the transport's business.
    DONE = "done"


@implementer(IPushProducer)
class Outlet:
    """Writes for one connection (see the module docstring).

    Registers itself as the transport's producer (on TCP always, elsewhere when it has a
    producer to pass backpressure on to): the connection must not register another, and closes
    through :meth:`close`.

    :param transport: the connection's transport.
    :param producer: told to pause while the client is not reading, and to resume.
    """

    __slots__ = (
        "_behind",
        "_body",
        "_direct",
        "_gathered",
        "_mode",
        "_paused",
        "_producer",
        "_queued",
        "_registered",
        "_socket",
        "_transport",
    )

    def __init__(self, transport: ITransport, producer: Producer | None = None) -> None:
        self._transport = cast(_Transport, transport)
        self._producer = producer
        self._queued = 0
        self._paused = False
        self._gathered: list[bytes] | None = None
        #: What is left to write of a body given to send_body, and what was sent after it.
        self._body: memoryview | None = None
        self._behind: list[bytes] = []
        # Only Twisted's own TCP connection is known to send what ``write`` queued in order
        # after what the kernel already took; TLS runs its own buffer (docs/performance.md).
        self._direct = isinstance(transport, tcp.Connection)
        self._socket = (
            cast(socket.socket, ISystemHandle(transport).getHandle()) if self._direct else None
        )
        self._mode = _Mode.DIRECT if self._direct else _Mode.QUEUED
        # A pull producer is asked for more at every drain; a push producer only after a pause.
        self._registered = self._direct or producer is not None
        if self._registered:
            self._transport.registerProducer(self, not self._direct)

    def send(self, data: bytes) -> None:
        """Write ``data``: to the kernel now when nothing is queued ahead, else behind; while a
        read is handled, once it has been (:class:`Gathering`)."""
        if GATHER.depth and self._mode is _Mode.DIRECT:
            gathered = self._gathered
            if gathered is None:
                self._gathered = [data]
                GATHER.outlets.append(self)
            else:
                gathered.append(data)
            return
        self._send_now(data)

    def release(self) -> None:
        """Send what was gathered (:class:`Gathering`), in one piece."""
        gathered, self._gathered = self._gathered, None
        if gathered:
            self._send_now(gathered[0] if len(gathered) == 1 else b"".join(gathered))

    def send_body(self, head: bytes, body: bytes) -> None:
        """Write ``head``, then ``body`` from where it is: to the kernel as it takes it, and a
        :data:`WINDOW` at a time into the transport's buffer when it takes no more for now,
        the next once that has drained. A body handed to the transport whole, or behind its
        head, would be copied whole (docs/robustness.md#what-a-request-body-costs)."""
        if self._gathered is not None:
            # What was written before goes first, now.
            self.release()
        if not self._registered:
            # A transport with a buffer of its own (TLS) says when it has drained only to a
            # producer: the body is fed to it as it does.
            self._registered = True
            self._transport.registerProducer(self, True)
        self._send_now(head)
        if self._body is not None:
            # An answer came before all of the last body went, and a next request follows on
            # the connection: behind it, in order.
            self._behind.append(body)
            return
        self._body = memoryview(body)
        self._feed()

    def _feed(self) -> None:
        """Write what the connection takes of the body now (see :meth:`send_body`)."""
        body = self._body
        while body is not None:
            if self._mode is _Mode.DONE:
                self._body = None
                self._behind = []
                return
            if self._mode is _Mode.DIRECT and not self._transport.disconnecting:
                body = body[self._to_kernel(body) :]
            if body and not self._paused:
                window = body[:WINDOW]
                body = body[len(window) :]
                self._body = body
                # Pauses this outlet past HIGH_WATER (or, on TLS, the transport does): the
                # rest waits for resumeProducing.
                self.queue(window.tobytes())
            if not body:
                body = self._body = None
                if self._behind:
                    body = self._body = memoryview(self._behind.pop(0))
            elif self._paused:
                self._body = body
                return

    def _send_now(self, data: bytes) -> None:
        if self._body is not None:
            # Behind the body still going out.
            self._behind.append(data)
            return
        if self._mode is _Mode.DIRECT and not self._transport.disconnecting:
            sent = self._to_kernel(data)
            if sent == len(data):
                return
            data = data[sent:]
        self.queue(data)

    def _to_kernel(self, data: bytes | memoryview) -> int:
        """How much of ``data`` the kernel takes now; 0 when it would block or the connection
        is failing: what is left is then queued as usual, and the transport's next write
        attempt meets the same error and closes its own way."""
        assert self._socket is not None
        try:
            return self._socket.send(data)
        except OSError:
            return 0

    def queue(self, data: bytes) -> None:
        """Write ``data`` at the reactor's next write turn, with whatever else is queued: the
        pieces written within one turn leave in one send."""
        if not data:
            return
        self._transport.write(data)
        if self._direct:
            if self._mode is _Mode.DIRECT:
                self._mode = _Mode.QUEUED
            self._queued += len(data)
            if self._queued > HIGH_WATER and not self._paused:
                self.pauseProducing()

    def close(self) -> None:
        """Close the connection once what was written has gone out.

        A transport holds its close while a producer is registered (TLS waits for it to
        unregister), so the outlet lets go first.
        """
        if self._gathered is not None:
            # What was written before the close goes first.
            self.release()
        # A body not yet written is not waited for: whoever closes is done with its exchange.
        self._body = None
        self._behind = []
        self._mode = _Mode.DONE
        if self._registered:
            self._registered = False
            self._transport.unregisterProducer()
        self._transport.loseConnection()

    # -- the transport's side ------------------------------------------------------------------

    def pauseProducing(self) -> None:
        """The client is not reading (a push transport's call, or past :data:`HIGH_WATER`)."""
        self._paused = True
        if self._producer is not None:
            self._producer.pauseProducing()

    def resumeProducing(self) -> None:
        """Everything written has gone out (a TCP transport calls this at each drain)."""
        self._queued = 0
        if self._direct:
            if self._transport.disconnecting:
                # A pull producer holds a closing TCP connection open: letting go lets the
                # transport finish its close once the buffer is empty.
                self._mode = _Mode.DONE
                self._registered = False
                self._transport.unregisterProducer()
                return
            if self._mode is _Mode.QUEUED:
                self._mode = _Mode.DIRECT
        if self._paused:
            self._paused = False
            if self._producer is not None:
                self._producer.resumeProducing()
        if self._body is not None:
            self._feed()

    def stopProducing(self) -> None:
        """The connection is gone: the producer is told, then let go (it holds this outlet,
        and a cycle would wait for a full collection)."""
        self._body = None
        self._behind = []
        self._mode = _Mode.DONE
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.stopProducing()

    @property
    def paused(self) -> bool:
        """Whether the client is behind (writes pile up in this process)."""
        return self._paused
