# -*- test-case-name: tests.wire.server.test_facade_server -*-
"""One request on a facade connection, as the request path sees it: its head and body as read,
and its answer, framed as it is written.

This is the :class:`nvpair.wire.web.ProxiedRequest` the request path answers through. The connection
it came on (:mod:`nvpair.wire.server.channel`) fills in the head and the body, and moves on to the
next request once this one's answer is finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from email.utils import formatdate
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

from twisted.internet.interfaces import IAddress, ITransport
from twisted.python.failure import Failure
from twisted.web.http import RESPONSES

from nvpair.wire.message import Ended, Fields, Flow, RequestHead, ResponseHead

if TYPE_CHECKING:
    from OpenSSL.crypto import X509
from nvpair.wire.outlet import Outlet
from nvpair.wire.server.body_budget import BodyBudget
from nvpair.wire.server.head import OVERLOADED, TOO_LARGE, Refusal
from nvpair.wire.server.held_body import Held, as_text, grow, whole

#: Statuses whose answers have no body, whatever the headers say (RFC 9110 §6.4.1).
_BODILESS_STATUS = frozenset({204, 304})

T = TypeVar("T")


class Connection(Protocol):
    """What a request uses of the connection it came on."""

    transport: ITransport | None

    @property
    def peer(self) -> IAddress | None:
        """The client's address, as the listener accepted it (over TLS, the TCP peer's)."""

    #: The way out: every write goes through it.
    outlet: Outlet
    #: The client is not reading: a flow followed now starts paused.
    write_paused: bool

    def answered(self, request: FacadeRequest) -> None:
        """``request``'s answer is complete: close, or move on to the next one."""

    def close(self) -> None:
        """Close once what was written has gone out."""


class _HttpDate:
    """The ``Date`` header's value, formatted at most once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._value = formatdate(second, usegmt=True).encode("ascii")
        return self._value


_DATE = _HttpDate()


class FacadeRequest:
    """One request on a facade connection: its head, its body (in memory, capped) and its answer.

    The answer is a :class:`~nvpair.wire.message.ResponseHead` (:meth:`respond`), then a body
    sink's pieces and end (:meth:`data`, :meth:`end`). Writing frames it the way the client's
    HTTP version and the request allow: the ``Content-Length`` its fields give, chunked
    otherwise (HTTP/1.1), or delimited by the close (HTTP/1.0); nothing after the head for
    ``HEAD``, 1xx, 204 and 304, and no ``Content-Length`` on 1xx, 204 and 304.
    """

    # One per stream in flight: no per-instance dictionary (docs/performance.md#held-streams).
    __slots__ = (
        "_answer",
        "_body",
        "_budget",
        "_chunked",
        "_flow",
        "_lost_waiters",
        "_no_body",
        "channel",
        "complete",
        "declared",
        "dispatched",
        "expects_continue",
        "finished",
        "head",
        "head_bytes",
        "keep_alive",
        "path",
        "received",
        "refused",
        "reserved",
        "stalled",
        "started",
        "status",
    )

    def __init__(self, channel: Connection) -> None:
        self.channel: Connection | None = channel
        #: Filled in as it is read: the wire writes its fields directly
        #: (docs/performance.md#headers). Its target is as sent until the head is admitted,
        #: in origin form from then on; its fields are let go once the answer has begun.
        self.head = RequestHead()
        #: The target's path, once the head is admitted.
        self.path = b""
        #: The answer's head until it is written (a stream held open keeps no head:
        #: docs/performance.md#held-streams).
        self._answer: ResponseHead | None = None
        #: The answer's status, once :meth:`respond` has been called.
        self.status: int | None = None
        self.keep_alive = True
        #: The declared ``Content-Length``, or :data:`~nvpair.wire.server.head.CHUNKED`.
        self.declared = 0
        #: Answered with this instead of being served; its body is read and dropped.
        self.refused: Refusal | None = None
        self.expects_continue = False
        self.complete = False
        self.dispatched = False
        #: The answer ended complete (:meth:`end`).
        self.finished = False
        #: The answer's head has gone out.
        self.started = False
        self._chunked = False
        self._no_body = False
        #: The body as it is held (nvpair.wire.server.held_body).
        self._body: Held = b""
        #: Body bytes received (of a refused body: dropped since the refusal).
        self.received = 0
        #: Body bytes reserved in ``_budget`` (``--max-body-memory``), given back once the
        #: body is let go.
        self.reserved = 0
        self._budget: BodyBudget | None = None
        #: Head (then trailer) bytes seen by the callbacks, and bytes fed since the last body
        #: byte: llhttp keeps partial names and values itself, so both are bounded.
        self.head_bytes = 0
        self.stalled = 0
        self._flow: Flow | None = None
        #: Told should the client leave before the answer is finished (:meth:`on_lost`).
        self._lost_waiters: list[Callable[[Failure], None]] = []

    # -- the request -------------------------------------------------------------------------

    def body(self) -> bytes:
        """The whole request body, as received (within the cap)."""
        body = self._body
        if type(body) is not bytes:
            body = self._body = whole(body)
        return body

    def read_json(self, read: Callable[[bytes | str], T]) -> T:
        """``read(body)``, the body given as a JSON reader takes it: its bytes or, large, its
        text, with the bytes let go until :meth:`body` asks for them again. Bytes, text and the
        document parsed from it held at once were three times a large body
        (docs/robustness.md#what-a-request-body-costs): ``read`` keeps nothing it parsed."""
        body = self.body()
        text = as_text(body)
        if text is None:
            return read(body)
        self._body = text
        del body
        return read(text)

    @property
    def connected(self) -> bool:
        """The client connection is still there."""
        return self.channel is not None

    @property
    def peer(self) -> IAddress | None:
        """The client's address (over TLS, the TCP peer's); None once it has gone."""
        channel = self.channel
        return channel.peer if channel is not None and channel.transport is not None else None

    def peer_certificate(self) -> X509 | None:
        """The certificate the client presented over TLS (an X509 once the handshake is
        done); None over plaintext, or once it has gone."""
        channel = self.channel
        # TLSMemoryBIOProtocol has getPeerCertificate but declares no ISSLTransport.
        presented = getattr(channel and channel.transport, "getPeerCertificate", None)
        return cast("X509 | None", presented()) if presented is not None else None

    # -- the answer --------------------------------------------------------------------------

    def respond(self, head: ResponseHead) -> None:
        """The answer's head, written with its first piece (or its end). An empty phrase is
        the status's usual one. Its :attr:`~nvpair.wire.message.ResponseHead.length` is not
        read: the answer is framed by the ``Content-Length`` its fields give, where its
        maker put it among them, or else chunked (or to the close)."""
        if self.started:
            raise RuntimeError("respond() after the head was written")
        self._answer = head
        self.status = head.status

    def data(self, chunk: bytes) -> None:
        """One piece of the answer's body; ``b""`` writes the head now, if it has not gone."""
        if self.finished:
            raise RuntimeError("data() after end()")
        channel = self.channel
        if channel is None or channel.transport is None:
            return
        outlet = channel.outlet
        if not self.started:
            head = self._head()
            if self._no_body or not chunk:
                outlet.send(head)
                return
            outlet.send(head + (self._frame(chunk) if self._chunked else chunk))
            return
        if self._no_body or not chunk:
            return
        # A stream's later pieces go out at once too: the relay writes one piece per upstream
        # read, so this is one send per read with no write interest toggled for it
        # (docs/performance.md#writes-go-out-at-once).
        outlet.send(self._frame(chunk) if self._chunked else chunk)

    def end(self, ended: Ended) -> None:
        """The answer's body ended. Complete, its framing ends it (the last chunk) and the
        connection moves on; else the connection closes once what was written has gone out,
        without that end, so the client sees the answer was cut."""
        if not ended.complete:
            channel = self.channel
            if channel is not None:
                channel.close()
            return
        if self.finished:
            raise RuntimeError("end() after end()")
        self._let_go()
        channel = self.channel
        if channel is None or channel.transport is None:
            return
        outlet = channel.outlet
        if not self.started:
            head = self._head()
            outlet.send(head + b"0\r\n\r\n" if self._chunked else head)
        elif self._chunked:
            outlet.send(b"0\r\n\r\n")
        # The answer's last bytes leave now, with what the same upstream read wrote before
        # them, rather than after whatever its end sets off (docs/performance.md#one-send-per-read).
        outlet.release()
        self.finished = True
        self._lost_waiters = []
        channel.answered(self)

    def abort(self) -> None:
        """Drop the client connection at once (a client that stopped reading)."""
        channel = self.channel
        if channel is not None and channel.transport is not None:
            channel.transport.abortConnection()  # type: ignore[attr-defined]

    def on_lost(self, lost: Callable[[Failure], None]) -> None:
        """Call ``lost`` once, should the client leave before the answer is finished: a
        callable kept, no Deferred made and fired for every request
        (docs/performance.md#per-dispatch-overheads)."""
        if self.finished:
            return
        if self.channel is None:
            lost(Failure(ConnectionError("the client connection was lost")))
        else:
            self._lost_waiters.append(lost)

    def follow(self, flow: Flow | None) -> None:
        """Pace ``flow`` (what the answer's body is read from) by the client: paused while the
        client's socket is full, resumed once it drains, stopped should the client leave.
        None: nothing is paced from now on."""
        channel = self.channel
        if channel is None:
            if flow is not None:
                flow.stop()
            return
        self._flow = flow
        if flow is not None and channel.write_paused:
            flow.pause()

    # -- the channel's side ------------------------------------------------------------------

    @property
    def flow(self) -> Flow | None:
        """What the answer's body is read from, paced by the client (:meth:`follow`)."""
        return self._flow

    def reserve(self, size: int, budget: BodyBudget) -> bool:
        """Reserve the declared length of the body before it comes; False when ``budget`` has
        no room for it."""
        if not budget.reserve(size):
            return False
        self.reserved += size
        self._budget = budget
        return True

    def take_body(self, data: bytes, cap: int, budget: BodyBudget) -> Refusal | None:
        """Keep a piece of body, or say why the request is refused instead: past ``cap``, or
        a chunked body that ``budget`` has no room for as it grows."""
        received = self.received + len(data)
        self.received = received
        if received > cap:
            return TOO_LARGE
        # Only a chunked body grows past what it reserved (llhttp holds a declared body to its
        # length).
        if received > self.reserved and not self.reserve(received - self.reserved, budget):
            return OVERLOADED
        self._body = grow(self._body, data)
        return None

    def refuse(self, refusal: Refusal) -> None:
        """Answer ``refusal`` instead: what was kept of the body goes, what follows is counted."""
        self.refused = refusal
        self._let_go()
        self.received = 0

    def _let_go(self) -> None:
        """The body is no longer held here: it goes, and what it reserved is given back."""
        self._body = b""
        reserved, self.reserved = self.reserved, 0
        if reserved:
            assert self._budget is not None
            self._budget.release(reserved)

    def lost(self, reason: Failure) -> None:
        self._let_go()
        self.channel = None
        flow, self._flow = self._flow, None
        if flow is not None and not self.finished:
            flow.stop()
        waiters, self._lost_waiters = self._lost_waiters, []
        for waiter in waiters:
            waiter(reason)

    def _head(self) -> bytes:
        answer = self._answer
        if answer is None:
            raise RuntimeError("the answer was written before respond()")
        self.started = True
        # Neither head is read again once the answer has begun, and the attempts sent a copy
        # of the request's fields: a stream held open keeps no other
        # (docs/performance.md#held-streams).
        self._answer = None
        request = self.head
        request.fields = Fields()
        status = answer.status
        version = request.version
        bodiless = status < 200 or status in _BODILESS_STATUS
        no_body = self._no_body = bodiless or request.method == b"HEAD"
        # One pass over the fields (names canonical), noting the two this method decides
        # about (docs/performance.md#headers).
        fields: list[bytes] = []
        length = date = False
        for name, values in answer.fields.items():
            if name == b"Content-Length":
                if bodiless:
                    # RFC 9110 §8.6: none on 1xx and 204; on 304 it could only repeat the
                    # engine's length of another answer, which a HEAD's 204 showed can be wrong.
                    continue
                length = True
            elif name == b"Date":
                date = True
            for value in values:
                fields += (name, b": ", value, b"\r\n")
        phrase = answer.phrase or RESPONSES.get(status, b"Unknown")
        lines = [b"%s %d %s\r\n" % (version, status, phrase)]
        if not no_body and not length:
            if version == b"HTTP/1.1":
                self._chunked = True
                lines.append(b"Transfer-Encoding: chunked\r\n")
            else:
                # An HTTP/1.0 body with no length ends with the connection.
                self.keep_alive = False
        lines += fields
        if not date:
            lines.append(b"Date: %s\r\n" % _DATE.now())
        if not self.keep_alive and version == b"HTTP/1.1":
            lines.append(b"Connection: close\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    @staticmethod
    def _frame(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)
