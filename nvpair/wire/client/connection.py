# -*- test-case-name: tests.wire.client.test_upstream_conn -*-
"""One upstream HTTP/1.1 connection: a request written whole, its response parsed by llhttp.

One exchange at a time, with Agent's keep-alive promises and none of its per-exchange objects
(docs/performance.md#the-upstream-client-our-own-on-llhttp): the head and body go out in one
write, and ``httptools`` (the llhttp binding uvicorn uses) frames the answer by the rules of
:mod:`nvpair.wire.client.framing` into an :class:`~nvpair.wire.message.Answer` whose body is
an :class:`~nvpair.wire.client.body.UpstreamBody`.

Parser callbacks only record; everything that runs other code (firing the request's Deferred,
delivering body bytes, ending the body, returning the connection to its pool) happens after
llhttp has returned, so nothing re-enters the parser.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from httptools.parser.parser import HttpResponseParser
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import ITCPTransport, ITransport
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure

from nvpair.wire.client.body import ReadFlow, UpstreamBody
from nvpair.wire.client.framing import MAX_HEAD, BadResponse
from nvpair.wire.client.reading import AnswerReader
from nvpair.wire.client.types import Payload, Phase, Resent, Wire
from nvpair.wire.message import Answer, NoAnswer
from nvpair.wire.outlet import GATHER, Outlet

# A member looked up through its class costs 45 ns on 3.11, a module global 5: these are read
# several times per exchange. Each by its name: reorder the enum and they still mean themselves.
_READY = Phase.READY
_WAITING_HEAD = Phase.WAITING_HEAD
_READING_BODY = Phase.READING_BODY
_BODY_DONE = Phase.BODY_DONE
_CLOSING = Phase.CLOSING
_CLOSED = Phase.CLOSED


#: Told that a connection can carry another exchange (its last ended cleanly): whoever made it
#: (a pool) decides whether it does. The connection knows nothing more of where it goes.
Quiescent = Callable[["UpstreamConnection"], None]

#: Told, in place of failing the request, that the connection went before any byte of its
#: answer came (a kept-alive connection the engine closed just then): sends the request again
#: on a fresh connection, firing the same Deferred, and returns what cancels that.
Unanswered = Callable[[Deferred[Answer]], Resent]


def _kept(connection: UpstreamConnection) -> None:
    """A connection nobody keeps: closed once its exchange ends."""
    connection.close()


class UpstreamConnection(AnswerReader):
    """One connection to an engine, carrying one exchange at a time.

    :meth:`send` writes a whole request and fires its Deferred with the answer once the head
    has arrived (1xx interim answers are skipped). ``quiescent`` is told only when the answer
    ended cleanly by its own framing, allows keep-alive, nothing followed it, and no reader
    stopped it; anything else closes it. It knows nothing of a pool: its maker's ``quiescent``
    decides where it goes between exchanges (docs/architecture.md#the-wire).

    :ivar phase: where it is now.
    """

    # One per stream in flight: no per-instance dictionary (docs/performance.md#held-streams).
    __slots__ = (
        "_deferred",
        "_flow",
        "_head",
        "_head_bytes",
        "_outlet",
        "_parser",
        "_quiescent",
        "_resend",
        "_resent",
        "_stopped",
        "_waiters",
        "_wire",
        "connected",
        "factory",
        "phase",
        "transport",
    )

    def __init__(self, quiescent: Quiescent = _kept) -> None:
        super().__init__()
        # Slots, where the Protocol base has class defaults.
        self.transport: ITransport | None = None
        self.connected = 0
        self.factory = None
        self._wire: Wire
        self._flow: ReadFlow
        self._outlet: Outlet
        self._quiescent = quiescent
        self.phase = _READY
        self._parser: HttpResponseParser | None = None
        self._deferred: Deferred[Answer] | None = None
        self._head = False
        self._head_bytes = 0
        self._stopped = False
        self._waiters: list[Deferred[None]] = []
        # Who sends again should a kept-alive connection go before answering
        # (docs/robustness.md#engine-answers), and what cancels that.
        self._resend: Unanswered | None = None
        self._resent: Resent | None = None

    def ready(self) -> bool:
        """Whether it can carry a request now: connected, and no exchange on it."""
        return self.phase is _READY

    def send(
        self,
        head: bool,
        data: Payload,
        deferred: Deferred[Answer],
        unanswered: Unanswered | None = None,
    ) -> None:
        """Write ``data`` (a whole request; ``head``: to HEAD) on this READY connection and
        fire ``deferred`` (whose canceller is :meth:`cancel`) with its response's head.

        :param unanswered: should the connection go before any byte of the answer, told in
            place of failing ``deferred`` (a kept-alive connection the engine closed).
        """
        self.phase = _WAITING_HEAD
        self._parser = HttpResponseParser(self)
        self._deferred = deferred
        self._head = head
        self._head_bytes = 0
        self._extra = False
        self._failure = None
        self._stopped = False
        self._resend = unanswered
        # Head and body in one write, now: once written the request is whole and in order on
        # the wire, so an answer that comes before the kernel sent all of it answers all of it.
        # A large body goes behind its head from where it is, as the connection takes it.
        if type(data) is bytes:
            self._outlet.send(data)
        else:
            self._outlet.send_body(*data)

    def cancel(self, deferred: Deferred[Answer]) -> None:
        """Canceller of :meth:`send`'s Deferred: before the head, abort the connection (the
        Deferred then fails with ``CancelledError``)."""
        if self._deferred is not deferred:
            if self._resent is not None:
                self._resent(deferred)
            return
        self._deferred = None
        self._parser = None
        self._abort()

    def close(self) -> Deferred[None]:
        """Close (an idle connection); fires once it is closed."""
        if self.phase is _CLOSED:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._waiters.append(waiter)
        if self.phase is not _CLOSING:
            self._lose()
        return waiter

    def _lose(self) -> None:
        self.phase = _CLOSING
        self._outlet.close()

    def _abort(self) -> None:
        self.phase = _CLOSING
        self._wire.abortConnection()

    # -- IProtocol -------------------------------------------------------------------------

    def connectionMade(self) -> None:
        transport = self.transport
        assert transport is not None
        self._wire = cast(Wire, transport)
        self._flow = ReadFlow(self._wire)
        self._outlet = Outlet(transport)
        # As Twisted's client: a request is one write, and Nagle would hold a small one back.
        if ITCPTransport.providedBy(transport):
            transport.setTcpNoDelay(True)

    def dataReceived(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:
            # Nothing was asked: bytes now mean the server's framing and ours disagree.
            phase = self.phase
            if phase is _READY:
                self._lose()
            return
        rest = b""
        if self._body is None:
            self._resend = None
            # The head cap counts every byte up to the final head's end, interim answers
            # included: past it llhttp is given nothing until that end has been seen, so where
            # the reads happen to split the stream makes no difference.
            room = MAX_HEAD - self._head_bytes
            if len(data) > room:
                data, rest = data[:room], data[room:]
            self._head_bytes += len(data)
        problem: Exception | None = None
        flow = self._flow
        flow.feeding = True
        # What this read makes anyone send leaves once it has been handled: a stream's last
        # piece with the terminator its end writes (docs/performance.md#one-send-per-read).
        with GATHER:
            try:
                try:
                    parser.feed_data(data)
                    if rest:
                        if self._pending is None:
                            raise BadResponse(f"response head over {MAX_HEAD} bytes")
                        parser.feed_data(rest)
                except Exception as error:
                    problem = self._failure or error
                self._after_feed(problem)
            finally:
                flow.feeding = False
        if flow.want_pause:
            flow.settle(self._body is not None)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.phase = _CLOSED
        self._parser = None
        self._pending = None
        deferred, self._deferred = self._deferred, None
        body, self._body = self._body, None
        again, self._resend = self._resend, None
        if deferred is not None:
            if again is not None:
                self._resent = again(deferred)
            else:
                deferred.errback(Failure(NoAnswer(reason.value)))
        elif body is not None:
            body.lost(reason)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)

    # -- after the parser returned ---------------------------------------------------------

    def _after_feed(self, problem: Exception | None) -> None:
        """Act on what one read recorded: the body's pieces and end first, then, if this read
        completed the answer's head, the answer handed on.

        One order whatever the read held: an answer whose whole body came with its head is
        handed on with its body ended and its connection reused or closed already, so whoever
        waits for it reads it at once, with no second wake of the request path
        (docs/performance.md#one-wake-per-answer).
        """
        answer = self._pending
        deferred = None
        if answer is not None:
            self._pending = None
            # The reader's BodySource is this connection's own UpstreamBody.
            self._body = cast(UpstreamBody, answer.body)
            deferred, self._deferred = self._deferred, None
        body = self._body
        if body is None:
            if problem is not None:
                self._fail_head(problem)
            return
        if self._chunks:
            # One read's pieces (a chunked body's chunks) go on as one piece: relayed, they
            # leave in one write (docs/performance.md#writes-go-out-at-once).
            chunks, self._chunks = self._chunks, []
            try:
                body.data(b"".join(chunks))
            except Exception as error:
                # The reader broke: the exchange ends with its error.
                self._fail_body(body, error)
        if self._body is not body:
            pass  # the reader broke, or the connection went while it had the bytes
        elif self.phase is _BODY_DONE:
            if problem is not None:
                # Bytes past the end that llhttp refused: a confused server.
                self._extra = True
            self._finish(body)
        elif problem is not None:
            self._fail_body(body, problem)
        elif not body.connected():
            self._flow.hold()
        if deferred is not None:
            assert answer is not None
            deferred.callback(answer)

    def _fail_head(self, problem: Exception) -> None:
        deferred, self._deferred = self._deferred, None
        self._parser = None
        self._abort()
        if deferred is not None:
            deferred.errback(Failure(NoAnswer(problem)))

    def _fail_body(self, body: UpstreamBody, error: BaseException) -> None:
        self._body = None
        self._parser = None
        self._abort()
        body.failed(error)

    def _finish(self, body: UpstreamBody) -> None:
        """The body ended by its framing: reuse or close, then tell the reader (last: it may
        send the next request on this very connection)."""
        self._body = None
        self._parser = None
        if body.keep_alive and not (self._extra or self._stopped):
            if self._flow.paused:
                # An idle connection must read, or a server's close would go unnoticed.
                self._flow.resume()
            self.phase = _READY
            self._quiescent(self)
        else:
            self._lose()
        body.end()

    # -- the body transport's side ---------------------------------------------------------

    def stop_body(self, abort: bool = False) -> None:
        """The reader wants no more: close; the body ends when the connection has gone (or
        whole, when its framing ended it in this very read)."""
        self._stopped = True
        phase = self.phase
        if phase is _BODY_DONE or phase is _CLOSED:
            return
        if abort:
            self._abort()
        elif phase is not _CLOSING:
            self._lose()
