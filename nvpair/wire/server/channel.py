# -*- test-case-name: tests.wire.server.test_facade_server -*-
"""One client connection to a facade: its phase, and the order in which its requests are read,
answered, refused and closed on.

- Requests are answered one at a time, in order. Requests pipelined behind an answer in
  progress are parsed and wait; reading goes on (so a client that leaves is noticed at once)
  until :data:`HELD_BYTES` have arrived, and pauses past that.
- A refusal is answered as soon as the head is parsed, then the refused body is read and
  dropped before the close (docs/robustness.md#refusals-at-the-request-head).
- A head must be complete within ``head_timeout`` of its first byte; a connection with no
  request in flight closes after ``idle_timeout`` without a byte.
- The answer's flow (the engine's answer) is paused while the client's socket is full.

Each connection is in one :class:`~nvpair.wire.server.types.Phase`, which decides what becomes of
the bytes it reads. The bytes themselves are llhttp's to read (:mod:`nvpair.wire.server.reader`).
"""

from __future__ import annotations

from twisted.internet.interfaces import IAddress, IPushProducer, ITransport
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from zope.interface import implementer

from nvpair.wire.outlet import Outlet
from nvpair.wire.server.head import OVERLOADED, TOO_LARGE, Refusal, admit_head
from nvpair.wire.server.reader import LINGER_QUIET, LINGER_SECONDS, RequestReader
from nvpair.wire.server.request import FacadeRequest
from nvpair.wire.server.timeouts import Timeouts
from nvpair.wire.server.types import Listener, Phase

#: Bytes read while an answer is in progress (pipelined requests, or bytes dropped) before
#: reading pauses until the answer is out.
HELD_BYTES = 64 * 1024

# Module names for the phases: an Enum member looked up on its class costs a Python call, and
# the phase is checked on every read.
_IDLE = Phase.IDLE
_READING = Phase.READING
_ANSWERING = Phase.ANSWERING
_FINISHING = Phase.FINISHING
_LINGERING = Phase.LINGERING
_CLOSING = Phase.CLOSING
_CLOSED = Phase.CLOSED

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


@implementer(IPushProducer)
class FacadeChannel(Protocol):
    """One client connection to a facade (see the module docstring)."""

    # One per stream in flight: no per-instance dictionary (docs/performance.md#held-streams).
    __slots__ = (
        "_address",
        "_held",
        "_last_data",
        "_parser",
        "_pending_refusal",
        "_reading_paused",
        "_requests",
        "_timeouts",
        "connected",
        "outlet",
        "phase",
        "site",
        "transport",
        "write_paused",
    )

    #: Seconds a client being closed on may take to read what it was sent (as twisted.web).
    abortTimeout = 15.0

    def __init__(self, site: Listener, address: IAddress | None) -> None:
        # Slots, where the Protocol base has class defaults.
        self.transport: ITransport | None = None
        self.connected = 0
        self.site = site
        self._address = address
        #: Made at a request's first byte; dropped while answered (performance.md#held-streams).
        self._parser: RequestReader | None = None
        #: Where it is now: what becomes of the bytes it reads.
        self.phase = _IDLE
        #: Requests in order: [0] is being answered (or read); the rest wait, parsed (a list:
        #: rarely more than one, where an empty deque is a 600-byte block).
        self._requests: list[FacadeRequest] = []
        #: A refusal owed once the answers in progress are out, for bytes that began no request.
        self._pending_refusal: Refusal | None = None
        #: Bytes read since an answer began while others wait (see HELD_BYTES).
        self._held = 0
        #: Reading was paused on the transport: a mirror of its producer state, not a phase.
        self._reading_paused = False
        self.write_paused = False
        #: The way out, once connected (every write goes through it).
        self.outlet: Outlet
        self._timeouts = Timeouts(self, site.clock, site.head_timeout, site.idle)
        self._last_data = 0.0

    @property
    def peer(self) -> IAddress | None:
        """The client's address as accepted (over TLS, the TCP peer's), kept: ``getPeer()``
        builds a new one per call."""
        return self._address

    @property
    def last_read(self) -> float:
        """When a byte was last read (the clock's seconds)."""
        return self._last_data

    @property
    def _ended(self) -> bool:
        """Nothing more is read: closing or closed."""
        phase = self.phase
        return phase is _CLOSING or phase is _CLOSED

    @property
    def _in_flight(self) -> bool:
        phase = self.phase
        return phase is _ANSWERING or phase is _FINISHING

    # -- the connection ------------------------------------------------------------------------

    def connectionMade(self) -> None:
        transport = self.transport
        assert transport is not None
        no_delay = getattr(transport, "setTcpNoDelay", None)
        if no_delay is not None:
            # Answers are written whole or as stream events: Nagle would only delay them.
            no_delay(True)
        # The outlet passes the client's backpressure on to this channel's producer.
        self.outlet = Outlet(transport, self)
        self._arm_idle()

    def dataReceived(self, data: bytes) -> None:
        phase = self.phase
        if phase is _IDLE:
            self.phase = _READING
        elif phase is _ANSWERING or phase is _FINISHING:
            self._hold(len(data))
        elif phase is _CLOSING or phase is _CLOSED:
            return
        self._last_data = self.site.clock.seconds()
        parser = self._parser
        if parser is None:
            if phase is _FINISHING or phase is _LINGERING:
                # Nothing more is parsed: the bytes are read (so a close is seen) and dropped.
                return
            site = self.site
            parser = self._parser = RequestReader(self, site.max_request_body, site.bodies)
        elif parser.parsing is None and (phase is _FINISHING or phase is _LINGERING):
            return
        if not parser.read(data):
            self._parser = None
        if phase is _IDLE:
            self._head_begun()

    def _head_begun(self) -> None:
        """A read after an idle wait has been parsed: the head it began is bounded from now,
        unless the read held it whole, as it nearly always does (a timer armed and cancelled
        within one read would be a cost per request for nothing; docs/performance.md#timers)."""
        if self.phase is _READING:
            requests = self._requests
            if not requests or not requests[0].head.method:
                self._timeouts.arm_head()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.phase = _CLOSED
        parser, self._parser = self._parser, None
        if parser is not None:
            parser.release()
        self._timeouts.cancel()
        requests, self._requests = self._requests, []
        for request in requests:
            request.lost(reason)

    # -- IPushProducer, for the transport's write buffer: passed on to the answer's flow ------

    def pauseProducing(self) -> None:
        self.write_paused = True
        flow = self._requests[0].flow if self._requests else None
        if flow is not None:
            flow.pause()

    def resumeProducing(self) -> None:
        self.write_paused = False
        flow = self._requests[0].flow if self._requests else None
        if flow is not None:
            flow.resume()

    def stopProducing(self) -> None:
        flow = self._requests[0].flow if self._requests else None
        if flow is not None:
            flow.stop()

    # -- what the reader says ------------------------------------------------------------------

    def begin(self) -> FacadeRequest:
        request = FacadeRequest(self)
        self._requests.append(request)
        return request

    def head_parsed(self, request: FacadeRequest, refusal: Refusal | None) -> None:
        """HTTP's own reasons to refuse a head, then the gate's, then the body cap, then the
        bodies held at once: a declared length is reserved before a byte of it is kept."""
        front = request is self._requests[0]
        if front:
            self._timeouts.disarm_head()
        site = self.site
        if refusal is None:
            head = request.head
            refusal = site.gate.refusal_at_head(
                self._address, head.target, head.fields, head.method
            )
        declared = request.declared
        if refusal is None and declared > site.max_request_body:
            refusal = TOO_LARGE
        if refusal is None and declared > 0 and not request.reserve(declared, site.bodies):
            refusal = OVERLOADED
        if refusal is not None:
            self.refuse(request, refusal)
            return
        admit_head(request)
        if request.expects_continue and front and self.transport is not None:
            self.outlet.send(_CONTINUE)

    def message_parsed(self, request: FacadeRequest) -> bool:
        if request.refused is not None:
            if self.phase is _LINGERING:
                # The refused body is all read: the close leaves nothing unread behind.
                self.close()
            # Nothing after a refused request is parsed; a queued one is answered in its turn.
            return True
        last = not request.keep_alive
        if request is self._requests[0]:
            self.phase = _FINISHING if last else _ANSWERING
            self._dispatch(request)
            if self._ended:
                return True
        elif last:
            self.phase = _FINISHING
        # RFC 9112 §9.6: nothing after a request that closes the connection is processed.
        return last

    def refuse(self, request: FacadeRequest, refusal: Refusal) -> None:
        """Refuse the request being parsed: now if it is at the front, else in its turn."""
        request.refuse(refusal)
        if request is self._requests[0]:
            self._answer_refusal(refusal, request)
        else:
            self.phase = _FINISHING

    def unparsable(self, refusal: Refusal) -> None:
        """The bytes cannot be read as HTTP/1.1: nothing more is parsed, and ``refusal`` is
        answered now if nothing is in flight, else once the answers before it are out."""
        parser = self._parser
        request = parser.stop() if parser is not None else None
        if self._ended or self.phase is _LINGERING:
            # Already refused: the body being dropped cannot be framed any more.
            self.close()
            return
        if request is None:
            if self._requests:
                self._pending_refusal = refusal
                self.phase = _FINISHING
            else:
                self._answer_refusal(refusal, None)
            return
        if request.refused is None:
            request.refuse(refusal)
        if request is self._requests[0]:
            self._answer_refusal(refusal, request)
        else:
            self.phase = _FINISHING

    # -- answering ---------------------------------------------------------------------------

    def _dispatch(self, request: FacadeRequest) -> None:
        request.dispatched = True
        # The idle bound never cuts an answer: no timer is held while one is in flight
        # (answered() arms it again; docs/performance.md#held-streams).
        self._timeouts.disarm_idle()
        self.site.gate.serve(request)

    def answered(self, request: FacadeRequest) -> None:
        """``request``'s answer is complete: close, or move on to the next one."""
        requests = self._requests
        if not requests or requests[0] is not request:
            return
        requests.pop(0)
        if not request.keep_alive:
            self.close()
            return
        # The idle bound counts from the last byte or the last answer, whichever is later.
        self._last_data = self.site.clock.seconds()
        self._arm_idle()
        if len(requests) <= 1:
            self._held = 0
            self._resume_reading()
        if not requests:
            if self._pending_refusal is not None:
                self._answer_refusal(self._pending_refusal, None)
            else:
                self.phase = _IDLE
            return
        following = requests[0]
        if following.refused is not None:
            self._answer_refusal(following.refused, following)
        elif following.complete:
            # On a fresh reactor turn, as uvicorn's next pipelined request: never on the stack
            # of the answer that just ended (an engine's read, the relay's end).
            self.site.clock.callLater(0, self._next, following)
        else:
            self.phase = _READING
            if not following.head.method:
                # Its head is still coming: its time starts now (the previous answer is out).
                self._timeouts.arm_head()
            elif following.expects_continue and self.transport is not None:
                self.outlet.send(_CONTINUE)

    def _next(self, request: FacadeRequest) -> None:
        if not self._ended and self._requests and self._requests[0] is request:
            self._dispatch(request)

    def close(self) -> None:
        """Close once what was written has gone out; a client that never reads it is aborted."""
        if self._ended:
            return
        self.phase = _CLOSING
        parser = self._parser
        if parser is not None:
            parser.stop()
        if self.transport is None:
            return
        self._timeouts.disarm_head()
        self._timeouts.abort_in(self.abortTimeout)
        self.outlet.close()

    def _answer_refusal(self, refusal: Refusal, request: FacadeRequest | None) -> None:
        """Write the refusal, then linger while its body arrives, or close."""
        transport = self.transport
        if transport is None or self._ended:
            return
        self._timeouts.disarm_head()
        head = request.head if request is not None else None
        target = head.target if head is not None and head.target else b"/"
        method = head.method if head is not None else b""
        # The fields only of a head read whole: a request line is read before them.
        fields = head.fields if head is not None and head.method else None
        self.outlet.send(
            self.site.gate.refusal_answer(refusal, target, method, fields, self._address)
        )
        parser = self._parser
        if request is None or parser is None or request is not parser.parsing:
            self.close()
            return
        # Closing now, with the body still arriving, would reset the connection and lose the
        # answer at a client that writes its whole body before reading.
        self.phase = _LINGERING
        self._resume_reading()
        self._timeouts.linger(LINGER_SECONDS, LINGER_QUIET)

    # -- reading and timers ------------------------------------------------------------------

    def _hold(self, size: int) -> None:
        self._held += size
        if self._held > HELD_BYTES:
            self._pause_reading()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pauseProducing()  # type: ignore[attr-defined]

    def _resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resumeProducing()  # type: ignore[attr-defined]

    def _arm_idle(self) -> None:
        if not self._ended:
            self._timeouts.arm_idle()

    # -- what the timeouts say ---------------------------------------------------------------

    def idle_expired(self) -> None:
        if self._in_flight:
            # A request in flight is never cut by the idle bound; its answer re-arms it.
            return
        # Every byte counts as activity (a body being uploaded slowly is not idle).
        site = self.site
        left = self._last_data + site.idle_timeout - site.clock.seconds()
        if left > 0:
            self._timeouts.idle_in(left)
            return
        self.close()

    def abort(self) -> None:
        """Drop the connection at once: its head took too long, or it read nothing of a close."""
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]
