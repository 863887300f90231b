# -*- test-case-name: tests.test_facade_head -*-
"""A facade's HTTP/1.1 server connection, on llhttp (``httptools``) inside Twisted's reactor.

twisted.web's server parses heads line by line in Python, builds a general-purpose request per
message and answers through layers a reverse proxy does not use; at the request rates a LAN
fleet sees, that machinery cost more than everything nvpair does per request (docs/performance.md).
This connection does only what a facade needs, and does it at the request head:

- HTTP's own rules are checked here (version, ``Host``, transfer coding, target form, method,
  the body cap); what a facade decides about the client (the loopback gate, Ollama's ``Host``
  guard) is asked of its :class:`Gate`, the one thing this module knows of a facade. A refusal
  is answered as soon as the head is parsed, then the refused body is read and dropped before
  the close (docs/robustness.md#refusals-at-the-request-head).
- A request head must be complete within ``head_timeout`` of its first byte, and a connection
  with no request in flight is closed after ``idle_timeout`` without a byte.
- Requests are answered one at a time, in order. Requests pipelined behind an answer in
  progress are parsed and wait; reading goes on (so a client that leaves is noticed at once)
  until :data:`HELD_BYTES` have arrived, and pauses past that.
- The response's producer (the upstream connection) is paused while the client's socket is
  full, so a slow reader slows the engine rather than growing this process.

Each connection is in one :class:`Phase`, which decides what becomes of the bytes it reads.
"""

from __future__ import annotations

import enum
import re
import time
from email.utils import formatdate
from typing import Protocol as TypingProtocol
from urllib.parse import urlsplit

from attrs import frozen
from httptools.parser.errors import (
    HttpParserCallbackError,
    HttpParserError,
    HttpParserInvalidMethodError,
    HttpParserInvalidURLError,
    HttpParserUpgrade,
)
from httptools.parser.parser import HttpRequestParser
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import (
    IAddress,
    IDelayedCall,
    IPushProducer,
    IReactorTime,
    ITransport,
)
from twisted.internet.protocol import Protocol, ServerFactory, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http import RESPONSES
from twisted.web.http_headers import Headers
from zope.interface import implementer

from nvpair.headers import SPENT
from nvpair.outlet import Outlet
from nvpair.reasons import Reason

#: Request line plus headers, as twisted.web bounds them: past this a head is 400. Trailer
#: fields, and chunk framing that carries no body byte, get the same bound.
MAX_HEAD_BYTES = 16 * 1024

#: Bytes read while an answer is in progress (pipelined requests, or bytes dropped) before
#: reading pauses until the answer is out.
HELD_BYTES = 64 * 1024

#: After a refusal, the refused body is read and dropped for at most this many bytes and
#: seconds before the close (docs/robustness.md#refusals-at-the-request-head).
LINGER_BYTES = 4 * 1024 * 1024
LINGER_SECONDS = 5.0

#: Statuses whose answers have no body, whatever the headers say (RFC 9110 §6.4.1).
_BODILESS_STATUS = frozenset({204, 304})

#: ``FacadeRequest.declared`` for a chunked body.
CHUNKED = -1

#: RFC 9112 §3.2's Host: uri-host [ ":" port ], an IP literal in brackets or a reg-name (which
#: covers IPv4 addresses); empty when the target has no authority.
_HOST = re.compile(rb"(?:\[[0-9A-Za-z:.%~_-]+\]|[0-9A-Za-z!$&'()*+,;=%._~-]*)(?::[0-9]*)?")

#: RFC 9110 §5.6.2's token, which a method is (RFC 9110 §9.1).
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


@frozen
class Refusal:
    """Why a request is not served: the proxy's reason and, when the reason's own message
    would not say it, what was wrong (fixed text, never request content).

    :ivar headers: header fields the answer carries besides its own (``WWW-Authenticate``,
        ``Retry-After``).
    """

    reason: Reason
    message: str | None = None
    headers: tuple[tuple[bytes, bytes], ...] = ()


HEAD_TOO_LARGE = Refusal(Reason.BAD_REQUEST, "the request line and headers are over 16 KiB")
FRAMING_TOO_LARGE = Refusal(
    Reason.BAD_REQUEST, "the chunked body's framing or trailer fields are over 16 KiB"
)
BAD_VERSION = Refusal(Reason.BAD_REQUEST, "only HTTP/1.0 and HTTP/1.1 are served")
OBS_FOLD = Refusal(Reason.BAD_REQUEST, "a header field is folded onto the next line (obs-fold)")
NOT_A_REQUEST_LINE = Refusal(
    Reason.BAD_REQUEST, "the request line is not a method, a target and an HTTP version"
)
NO_HOST = Refusal(Reason.BAD_REQUEST, "an HTTP/1.1 request must carry a Host header")
SEVERAL_HOSTS = Refusal(Reason.BAD_REQUEST, "a request must carry one Host header, not several")
BAD_HOST = Refusal(Reason.BAD_REQUEST, "the Host header is not a host with an optional port")
FRAMING_IN_1_0 = Refusal(Reason.BAD_REQUEST, "an HTTP/1.0 request cannot carry Transfer-Encoding")
BAD_TARGET = Refusal(
    Reason.BAD_REQUEST,
    "a target must be in origin form (/path) or absolute form (http://host/path)",
)
NOT_CHUNKED = Refusal(
    Reason.NOT_IMPLEMENTED, "the only request transfer coding implemented is chunked"
)
UNKNOWN_METHOD = Refusal(
    Reason.NOT_IMPLEMENTED, "the request method is not one this proxy can carry"
)
NO_TUNNEL = Refusal(Reason.NOT_IMPLEMENTED, "CONNECT is not served: this is no forward proxy")
TOO_LARGE = Refusal(Reason.BODY_TOO_LARGE)
INTERNAL = Refusal(Reason.INTERNAL)

#: llhttp's reasons for a transfer coding it will not frame (RFC 9112 §6.3: chunked not last).
_CODING_ERRORS = frozenset(
    {"Invalid `Transfer-Encoding` header value", "Request has invalid `Transfer-Encoding`"}
)
#: llhttp's reasons for a method it knows but will not carry in HTTP/1.x: RTSP's (``DESCRIBE``,
#: ``SETUP``...), and ``PRI`` anywhere but in HTTP/2's connection preface.
_METHOD_ERRORS = frozenset(
    {"Invalid method for HTTP/x.x request", "Expected HTTP/2 Connection Preface"}
)
#: llhttp's reason for a line that begins with whitespace inside a head: a field folded onto it
#: (RFC 9112 §5.2).
_FOLDED = "Unexpected whitespace after header value"
#: llhttp's reason for HTTP/2's connection preface (``PRI * HTTP/2.0``, a client with prior
#: knowledge).
_PREFACE = "Pause on PRI/Upgrade"


def parse_refusal(error: HttpParserError, start: bytes | None = None) -> Refusal:
    """The refusal for bytes llhttp rejected, naming what it found wrong (its reasons are
    fixed text).

    :param start: the bytes the refused request begins with, when they are known (the read
        that held them began between requests): llhttp refuses a method it does not know and
        bytes that are no method alike, and only the first are 501.
    """
    if isinstance(error, HttpParserInvalidMethodError):
        if start is not None and _TOKEN.fullmatch(start.lstrip(b"\r\n").split(b" ", 1)[0]) is None:
            return NOT_A_REQUEST_LINE
        return UNKNOWN_METHOD
    if isinstance(error, HttpParserInvalidURLError):
        return BAD_TARGET
    reason = str(error)
    if reason in _CODING_ERRORS:
        return NOT_CHUNKED
    if reason in _METHOD_ERRORS:
        return UNKNOWN_METHOD
    if reason == _FOLDED:
        return OBS_FOLD
    if reason == _PREFACE:
        return BAD_VERSION
    return Refusal(Reason.BAD_REQUEST, f"malformed request: {reason}")


def origin_form(target: bytes) -> bytes | None:
    """The request target as ``/path?query``, or None when it is neither form a proxy accepts.

    Origin form (``/api/chat``) is returned as it is. Absolute form
    (``http://127.0.0.1:11435/api/chat?x=1``, RFC 9112 §3.2.2) is reduced to its path and
    query: the upstream URL is always a node's base URL plus these, never client bytes
    appended to a host. Asterisk and authority forms, a fragment, and anything else, are None.
    """
    if target.startswith(b"/"):
        return None if b"#" in target else target
    if not target[:8].lower().startswith((b"http://", b"https://")):
        return None
    try:
        parts = urlsplit(target.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not parts.netloc or parts.fragment:
        return None
    path = parts.path or "/"
    if not path.startswith("/"):
        return None
    return (path + ("?" + parts.query if parts.query else "")).encode("ascii")


class Gate(TypingProtocol):
    """What the wire asks of the facade it serves: everything engine-specific is behind this."""

    def refusal_at_head(
        self, peer: IAddress | None, target: bytes, headers: Headers, method: bytes
    ) -> Refusal | None:
        """The facade's reason to refuse a request from its head alone, or None to read on.

        Asked once HTTP's own rules hold: the target is in origin or absolute form, and there
        is at most one ``Host``.

        :param target: the request target as sent.
        """

    def refusal_answer(self, refusal: Refusal, target: bytes, method: bytes) -> bytes:
        """A whole answer to ``refusal``, in the facade's dialect, saying the connection closes.

        :param target: the request target as sent (``b"/"`` when no request line was read).
        :param method: the request's method (empty when no request line was read).
        """

    def serve(self, request: FacadeRequest) -> None:
        """Answer a whole request (head and body) that passed every check at its head."""


class Phase(enum.Enum):
    """What a connection is doing; each decides what becomes of the bytes it reads."""

    #: No request begun: waiting for a head, under the idle bound.
    IDLE = "idle"
    #: The request at the front is arriving (head or body); nothing is in flight.
    READING = "reading"
    #: The front request is being answered; what follows is parsed and waits its turn.
    ANSWERING = "answering"
    #: Answering what was parsed; nothing new is parsed, and the connection closes after it
    #: (a refusal may be owed once the answers before it are out).
    FINISHING = "finishing"
    #: A refusal was written; the refused body is read and dropped before the close.
    LINGERING = "lingering"
    #: The close was asked for; nothing more is read.
    CLOSING = "closing"
    #: The connection is gone.
    CLOSED = "closed"


# Module names for the phases: an Enum member looked up on its class costs a Python call, and
# the phase is checked on every read.
_IDLE = Phase.IDLE
_READING = Phase.READING
_ANSWERING = Phase.ANSWERING
_FINISHING = Phase.FINISHING
_LINGERING = Phase.LINGERING
_CLOSING = Phase.CLOSING
_CLOSED = Phase.CLOSED


class _Stop(Exception):
    """Raised inside a parser callback to stop parsing: what follows is not read as HTTP."""


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

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class FacadeRequest:
    """One request on a facade connection: its head, its body (in memory, capped) and its answer.

    This is the :class:`nvpair.web.ProxiedRequest` the request path answers through. Writing
    frames the answer the way the client's HTTP version and the request allow: the engine's
    ``Content-Length`` when it gave one, chunked otherwise (HTTP/1.1), or delimited by the close
    (HTTP/1.0); nothing after the head for ``HEAD``, 1xx, 204 and 304, and no
    ``Content-Length`` on 1xx, 204 and 304.
    """

    # One per stream in flight: no per-instance dictionary (docs/performance.md#held-streams).
    __slots__ = (
        "_body",
        "_chunked",
        "_finish_waiters",
        "_no_body",
        "_producer",
        "channel",
        "clientproto",
        "code",
        "code_message",
        "complete",
        "declared",
        "dispatched",
        "expects_continue",
        "finished",
        "head_bytes",
        "keep_alive",
        "method",
        "path",
        "received",
        "refused",
        "requestHeaders",
        "responseHeaders",
        "stalled",
        "startedWriting",
        "uri",
    )

    def __init__(self, channel: FacadeChannel) -> None:
        self.channel: FacadeChannel | None = channel
        self.method = b""
        #: The target as sent (origin or absolute form), then origin form once admitted.
        self.uri = b""
        self.path = b""
        self.clientproto = b"HTTP/1.1"
        self.requestHeaders = Headers()
        self.responseHeaders = Headers()
        self.code = 200
        self.code_message = b"OK"
        self.keep_alive = True
        #: The declared ``Content-Length``, or :data:`CHUNKED`.
        self.declared = 0
        #: Answered with this instead of being served; its body is read and dropped.
        self.refused: Refusal | None = None
        self.expects_continue = False
        self.complete = False
        self.dispatched = False
        self.finished = False
        self.startedWriting = False
        self._chunked = False
        self._no_body = False
        #: The first piece of body as it came; a bytearray once a second piece joins it, so a
        #: body of many small chunks costs its bytes, not an object per chunk.
        self._body: bytes | bytearray = b""
        #: Body bytes received (of a refused body: dropped since the refusal).
        self.received = 0
        #: Head (then trailer) bytes seen by the callbacks, and bytes fed since the last body
        #: byte: llhttp keeps partial names and values itself, so both are bounded.
        self.head_bytes = 0
        self.stalled = 0
        self._producer: IPushProducer | None = None
        self._finish_waiters: list[Deferred[None]] = []

    # -- the request -------------------------------------------------------------------------

    def body(self) -> bytes:
        """The whole request body, as received (within the cap)."""
        body = self._body
        if isinstance(body, bytearray):
            body = self._body = bytes(body)
        return body

    @property
    def connected(self) -> bool:
        """The client connection is still there."""
        return self.channel is not None

    # -- the answer --------------------------------------------------------------------------

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        self.code = code
        self.code_message = message if message is not None else RESPONSES.get(code, b"Unknown")

    def setHeader(self, name: bytes, value: bytes) -> None:
        self.responseHeaders.setRawHeaders(name, [value])

    def write(self, data: bytes) -> None:
        if self.finished:
            raise RuntimeError("write() after finish()")
        channel = self.channel
        if channel is None or channel.transport is None:
            return
        outlet = channel.outlet
        if not self.startedWriting:
            head = self._head()
            if self._no_body or not data:
                outlet.send(head)
                return
            outlet.send(head + (self._frame(data) if self._chunked else data))
            return
        if self._no_body or not data:
            return
        # A stream's later pieces are queued, not sent one by one: the pieces relayed from one
        # upstream read go out in one send at the reactor's turn
        # (docs/performance.md#writes-go-out-at-once).
        outlet.queue(self._frame(data) if self._chunked else data)

    def finish(self) -> None:
        if self.finished:
            raise RuntimeError("finish() called twice")
        channel = self.channel
        if channel is None or channel.transport is None:
            return
        if not self.startedWriting:
            head = self._head()
            channel.outlet.send(head + b"0\r\n\r\n" if self._chunked else head)
        elif self._chunked:
            channel.outlet.send(b"0\r\n\r\n")
        self.finished = True
        waiters, self._finish_waiters = self._finish_waiters, []
        for waiter in waiters:
            waiter.callback(None)
        channel.answered(self)

    def loseConnection(self) -> None:
        """Close after what was written has gone out (a truncated answer stays truncated)."""
        channel = self.channel
        if channel is not None:
            channel.close()

    def abort(self) -> None:
        """Drop the client connection at once (a client that stopped reading)."""
        channel = self.channel
        if channel is not None and channel.transport is not None:
            channel.transport.abortConnection()  # type: ignore[attr-defined]

    def notifyFinish(self) -> Deferred[None]:
        """Fires when the answer is done; fails when the client left first."""
        waiter: Deferred[None] = Deferred()
        if self.finished:
            waiter.callback(None)
        elif self.channel is None:
            waiter.errback(Failure(ConnectionError("the client connection was lost")))
        else:
            self._finish_waiters.append(waiter)
        return waiter

    def registerProducer(self, producer: IPushProducer, streaming: bool) -> None:
        channel = self.channel
        if channel is None:
            producer.stopProducing()
            return
        self._producer = producer
        if channel.write_paused:
            producer.pauseProducing()

    def unregisterProducer(self) -> None:
        self._producer = None

    # -- the channel's side ------------------------------------------------------------------

    @property
    def producer(self) -> IPushProducer | None:
        return self._producer

    def take_body(self, data: bytes, cap: int) -> bool:
        """Keep a piece of body; False once the body is past ``cap`` (nothing more is kept)."""
        received = self.received + len(data)
        self.received = received
        if received > cap:
            self._body = b""
            return False
        body = self._body
        if not body:
            self._body = data
        elif isinstance(body, bytes):
            self._body = bytearray(body) + data
        else:
            body += data
        return True

    def refuse(self, refusal: Refusal) -> None:
        """Answer ``refusal`` instead: what was kept of the body goes, what follows is counted."""
        self.refused = refusal
        self._body = b""
        self.received = 0

    def lost(self, reason: Failure) -> None:
        self.channel = None
        producer, self._producer = self._producer, None
        if producer is not None and not self.finished:
            producer.stopProducing()
        waiters, self._finish_waiters = self._finish_waiters, []
        for waiter in waiters:
            waiter.errback(reason)

    def _head(self) -> bytes:
        self.startedWriting = True
        code = self.code
        headers = self.responseHeaders
        bodiless = code < 200 or code in _BODILESS_STATUS
        if bodiless and headers.hasHeader(b"content-length"):
            # RFC 9110 §8.6: none on 1xx and 204; on 304 it could only repeat the engine's
            # length of another answer, which a HEAD's 204 showed can be wrong.
            headers.removeHeader(b"content-length")
        self._no_body = bodiless or self.method == b"HEAD"
        lines = [b"%s %d %s\r\n" % (self.clientproto, code, self.code_message)]
        if not self._no_body and not headers.hasHeader(b"content-length"):
            if self.clientproto == b"HTTP/1.1":
                self._chunked = True
                lines.append(b"Transfer-Encoding: chunked\r\n")
            else:
                # An HTTP/1.0 body with no length ends with the connection.
                self.keep_alive = False
        for name, values in headers.getAllRawHeaders():
            for value in values:
                lines.append(b"%s: %s\r\n" % (name, value))
        if not headers.hasHeader(b"date"):
            lines.append(b"Date: %s\r\n" % _DATE.now())
        if not self.keep_alive and self.clientproto == b"HTTP/1.1":
            lines.append(b"Connection: close\r\n")
        lines.append(b"\r\n")
        self.responseHeaders = SPENT
        return b"".join(lines)

    @staticmethod
    def _frame(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)


def _reframing_head(request: FacadeRequest) -> bytes:
    """A head that frames the body of ``request``, for llhttp to read after an upgrade offer."""
    if request.declared == CHUNKED:
        return b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    return b"POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % request.declared


@implementer(IPushProducer)
class FacadeChannel(Protocol):
    """One client connection to a facade (see the module docstring)."""

    # One per stream in flight: no per-instance dictionary (docs/performance.md#held-streams).
    __slots__ = (
        "_abort_timer",
        "_address",
        "_head_timer",
        "_held",
        "_idle_timer",
        "_last_data",
        "_linger_timer",
        "_parser",
        "_parsing",
        "_pending_refusal",
        "_phase",
        "_reading_paused",
        "_requests",
        "connected",
        "outlet",
        "site",
        "transport",
        "write_paused",
    )

    #: Seconds a client being closed on may take to read what it was sent (as twisted.web).
    abortTimeout = 15.0

    log = Logger()

    def __init__(self, site: FacadeSite, address: IAddress | None) -> None:
        # Slots, where the Protocol base has class defaults.
        self.transport: ITransport | None = None
        self.connected = 0
        self.site = site
        self._address = address
        #: Made at a request's first byte, dropped while one is answered with nothing half-read
        #: (docs/performance.md#held-streams).
        self._parser: HttpRequestParser | None = None
        self._phase = _IDLE
        #: Requests in order: [0] is being answered (or read); the rest wait, parsed. A list:
        #: rarely more than one, where an empty deque is a 600-byte block.
        self._requests: list[FacadeRequest] = []
        #: The request llhttp is in the middle of (None: between requests, or none will be).
        self._parsing: FacadeRequest | None = None
        #: A refusal owed once the answers in progress are out, for bytes that began no request.
        self._pending_refusal: Refusal | None = None
        #: Bytes read since an answer began while others wait (see HELD_BYTES).
        self._held = 0
        #: Reading was paused on the transport: a mirror of its producer state, not a phase.
        self._reading_paused = False
        self.write_paused = False
        #: The way out, once connected (every write goes through it).
        self.outlet: Outlet
        self._head_timer: IDelayedCall | None = None
        self._idle_timer: IDelayedCall | None = None
        self._linger_timer: IDelayedCall | None = None
        self._abort_timer: IDelayedCall | None = None
        self._last_data = 0.0

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def _ended(self) -> bool:
        """Nothing more is read: closing or closed."""
        phase = self._phase
        return phase is _CLOSING or phase is _CLOSED

    @property
    def _in_flight(self) -> bool:
        phase = self._phase
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
        phase = self._phase
        if phase is _IDLE:
            self._phase = _READING
            self._arm_head_timer()
        elif phase is _ANSWERING or phase is _FINISHING:
            self._hold(len(data))
        elif phase is _CLOSING or phase is _CLOSED:
            return
        self._last_data = self.site.clock.seconds()
        parsing = self._parsing
        if parsing is None and (phase is _FINISHING or phase is _LINGERING):
            # Nothing more is parsed: the bytes are read (so a close is seen) and dropped.
            return
        received = parsing.received if parsing is not None else 0
        self._feed(data, parsing is None)
        current = self._parsing
        if current is None or self._ended:
            return
        # llhttp keeps a partial name or value itself, across reads: bound what it holds.
        if current is parsing:
            if parsing.received != received:
                parsing.stalled = 0
                return
            parsing.stalled += len(data)
        elif current.received:
            return
        else:
            # The request began in this read: llhttp holds at most what follows its last line end.
            current.stalled = len(data) - data.rfind(b"\n") - 1
        if current.stalled > MAX_HEAD_BYTES:
            self._unparsable(FRAMING_TOO_LARGE if current.method else HEAD_TOO_LARGE)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._phase = _CLOSED
        self._parsing = None
        # Its callbacks are bound to this channel: a cycle left for the collector otherwise.
        self._parser = None
        self._cancel_timers()
        requests, self._requests = self._requests, []
        for request in requests:
            request.lost(reason)

    def _feed(self, data: bytes, between: bool) -> None:
        """Parse ``data``; ``between``: it begins between two requests."""
        parser = self._parser
        if parser is None:
            parser = self._parser = HttpRequestParser(self)
        while True:
            try:
                parser.feed_data(data)
                if self._parsing is None and self._phase is _ANSWERING:
                    # Between requests, one kept alive being answered: llhttp holds nothing a
                    # fresh parser would not, so a held stream keeps none.
                    self._parser = None
                return
            except HttpParserUpgrade as upgrade:
                # An upgrade offer (h2c, websocket) is ignored, as nginx ignores it: llhttp
                # stopped where the other protocol would begin, taking the request as bodiless.
                # Its body, if it has one, is framed by a head made for it; then reading goes on
                # as HTTP/1.1.
                data = data[upgrade.args[0] :]
                between = False
                if self._ended:
                    return
                request = self._parsing
                if request is not None:
                    # A fresh parser: the one that stopped would refuse anything after an offer
                    # that also said Connection: close.
                    parser = self._parser = HttpRequestParser(self)
                    data = _reframing_head(request) + data
            except HttpParserCallbackError as error:
                if not isinstance(error.__context__, _Stop):
                    self.log.failure(
                        "reading a request failed", Failure(error.__context__ or error)
                    )
                    self._unparsable(INTERNAL)
                elif self._parsing is None and self._phase is _FINISHING:
                    # The last request is read: nothing more is ever parsed (dataReceived).
                    self._parser = None
                return
            except HttpParserError as error:
                self._note_method(error)
                # Only a read that began between requests shows the refused one's first word
                # (or, if requests came before it in the read, the first one's: a method).
                self._unparsable(parse_refusal(error, data if between else None))
                return

    def _llhttp(self) -> HttpRequestParser:
        """The parser whose callback is running."""
        parser = self._parser
        assert parser is not None
        return parser

    def _note_method(self, error: HttpParserError) -> None:
        """Keep the method of a request line llhttp stopped in: a refusal to a HEAD has no body,
        and a client would read one as the start of an answer."""
        request = self._parsing
        invalid_method = isinstance(error, HttpParserInvalidMethodError)
        if request is not None and not request.method and not invalid_method:
            # llhttp stores the method before it reads on.
            request.method = self._llhttp().get_method()

    # -- IPushProducer, for the transport's write buffer -----------------------------------

    def pauseProducing(self) -> None:
        self.write_paused = True
        producer = self._requests[0].producer if self._requests else None
        if producer is not None:
            producer.pauseProducing()

    def resumeProducing(self) -> None:
        self.write_paused = False
        producer = self._requests[0].producer if self._requests else None
        if producer is not None:
            producer.resumeProducing()

    def stopProducing(self) -> None:
        producer = self._requests[0].producer if self._requests else None
        if producer is not None:
            producer.stopProducing()

    # -- httptools callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._parsing is not None:
            # The head framing an upgrade offer's body (_feed): the request is the same.
            return
        request = FacadeRequest(self)
        self._parsing = request
        self._requests.append(request)

    def on_url(self, url: bytes) -> None:
        request = self._parsing
        assert request is not None
        if request.method:
            return
        request.uri += url
        if len(request.uri) > MAX_HEAD_BYTES:
            self._unparsable(HEAD_TOO_LARGE)
            raise _Stop()

    def on_header(self, name: bytes, value: bytes) -> None:
        request = self._parsing
        assert request is not None
        request.head_bytes += len(name) + len(value) + 4
        if request.method:
            # A trailer field (or a field of the head framing an upgrade offer's body): dropped,
            # never merged into the headers sent on.
            if request.head_bytes > MAX_HEAD_BYTES:
                self._unparsable(FRAMING_TOO_LARGE)
                raise _Stop()
            return
        if request.head_bytes + len(request.uri) > MAX_HEAD_BYTES:
            self._unparsable(HEAD_TOO_LARGE)
            raise _Stop()
        # RFC 9112 §5: whitespace after the value is not part of it (llhttp drops only what
        # precedes it). rstrip returns the value itself when there is none.
        request.requestHeaders.addRawHeader(name, value.rstrip(b" \t"))

    def on_headers_complete(self) -> None:
        request = self._parsing
        assert request is not None
        if request.method:
            return
        request.method = self._llhttp().get_method()
        request.head_bytes = 0
        front = request is self._requests[0]
        if front:
            self._disarm_head_timer()
        refusal = self._head_refusal(request)
        if refusal is not None:
            self._refuse(request, refusal)
            return
        target = origin_form(request.uri)
        assert target is not None
        request.uri = target
        request.path = target.split(b"?", 1)[0]
        expect = request.requestHeaders.getRawHeaders(b"expect")
        if expect and request.clientproto == b"HTTP/1.1" and b"100-continue" in expect[0].lower():
            request.expects_continue = True
            if front and self.transport is not None:
                self.outlet.send(_CONTINUE)

    def on_body(self, data: bytes) -> None:
        request = self._parsing
        assert request is not None
        if request.refused is not None:
            request.received += len(data)
            if self._phase is _LINGERING and request.received > LINGER_BYTES:
                self.close()
                raise _Stop()
            return
        if not request.take_body(data, self.site.max_request_body):
            self._refuse(request, TOO_LARGE)

    def on_message_complete(self) -> None:
        request = self._parsing
        assert request is not None
        if request.declared and self._llhttp().should_upgrade():
            # An upgrade offer with a body: llhttp took it as bodiless (see _feed).
            return
        self._parsing = None
        request.complete = True
        if request.refused is not None:
            if self._phase is _LINGERING:
                # The refused body is all read: the close leaves nothing unread behind.
                self.close()
            # Nothing after a refused request is parsed; a queued one is answered in its turn.
            raise _Stop()
        last = not request.keep_alive
        if request is self._requests[0]:
            self._phase = _FINISHING if last else _ANSWERING
            self._dispatch(request)
            if self._ended:
                raise _Stop()
        elif last:
            self._phase = _FINISHING
        if last:
            # RFC 9112 §9.6: nothing after a request that closes the connection is processed.
            raise _Stop()

    # -- the head ----------------------------------------------------------------------------

    def _head_refusal(self, request: FacadeRequest) -> Refusal | None:
        """HTTP's own reasons to refuse a head, then the gate's, then the body cap."""
        parser = self._llhttp()
        version = parser.get_http_version()
        if version == "1.0":
            request.clientproto = b"HTTP/1.0"
        elif version != "1.1":
            # llhttp reads any single-digit version; a facade speaks HTTP/1.x only.
            return BAD_VERSION
        # HTTP/1.0 connections are not kept alive, as twisted.web did before: one answer each.
        request.keep_alive = version == "1.1" and parser.should_keep_alive()
        headers = request.requestHeaders
        codings = headers.getRawHeaders(b"transfer-encoding")
        if codings is not None:
            if version == "1.0":
                # RFC 9112 §6.1: its framing is to be taken as faulty; nginx refuses it too.
                return FRAMING_IN_1_0
            # llhttp decodes chunked, and would let another coding before it through as body.
            if len(codings) != 1 or codings[0].strip().lower() != b"chunked":
                return NOT_CHUNKED
            request.declared = CHUNKED
        else:
            lengths = headers.getRawHeaders(b"content-length")
            if lengths:
                # llhttp has already refused a malformed or conflicting length.
                request.declared = int(lengths[0])
        hosts = headers.getRawHeaders(b"host")
        if hosts is None:
            if version == "1.1":
                return NO_HOST
        elif len(hosts) > 1:
            return SEVERAL_HOSTS
        elif _HOST.fullmatch(hosts[0]) is None:
            return BAD_HOST
        if request.method == b"CONNECT":
            return NO_TUNNEL
        if origin_form(request.uri) is None:
            return BAD_TARGET
        refusal = self.site.gate.refusal_at_head(
            self._address, request.uri, headers, request.method
        )
        if refusal is not None:
            return refusal
        if request.declared > self.site.max_request_body:
            return TOO_LARGE
        return None

    # -- answering ---------------------------------------------------------------------------

    def _dispatch(self, request: FacadeRequest) -> None:
        request.dispatched = True
        # The idle bound never cuts an answer: no timer is held while one is in flight
        # (answered() arms it again; docs/performance.md#held-streams).
        idle = self._idle_timer
        if idle is not None:
            self._idle_timer = None
            self._cancel(idle)
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
                self._phase = _IDLE
            return
        following = requests[0]
        if following.refused is not None:
            self._answer_refusal(following.refused, following)
        elif following.complete:
            self._dispatch(following)
        else:
            self._phase = _READING
            if not following.method:
                # Its head is still coming: its time starts now (the previous answer is out).
                self._arm_head_timer()
            elif following.expects_continue and self.transport is not None:
                self.outlet.send(_CONTINUE)

    def close(self) -> None:
        """Close once what was written has gone out; a client that never reads it is aborted."""
        if self._ended:
            return
        self._phase = _CLOSING
        self._parsing = None
        transport = self.transport
        if transport is None:
            return
        self._disarm_head_timer()
        if self._abort_timer is None:
            self._abort_timer = self.site.clock.callLater(self.abortTimeout, self._abort)
        self.outlet.close()

    def _refuse(self, request: FacadeRequest, refusal: Refusal) -> None:
        """Refuse the request being parsed: now if it is at the front, else in its turn."""
        request.refuse(refusal)
        if request is self._requests[0]:
            self._answer_refusal(refusal, request)
        else:
            self._phase = _FINISHING

    def _unparsable(self, refusal: Refusal) -> None:
        """The bytes cannot be read as HTTP/1.1: nothing more is parsed, and ``refusal`` is
        answered now if nothing is in flight, else once the answers before it are out."""
        request = self._parsing
        self._parsing = None
        if self._ended or self._phase is _LINGERING:
            # Already refused: the body being dropped cannot be framed any more.
            self.close()
            return
        if request is None:
            if self._requests:
                self._pending_refusal = refusal
                self._phase = _FINISHING
            else:
                self._answer_refusal(refusal, None)
            return
        if request.refused is None:
            request.refuse(refusal)
        if request is self._requests[0]:
            self._answer_refusal(refusal, request)
        else:
            self._phase = _FINISHING

    def _answer_refusal(self, refusal: Refusal, request: FacadeRequest | None) -> None:
        """Write the refusal, then linger while its body arrives, or close."""
        transport = self.transport
        if transport is None or self._ended:
            return
        self._disarm_head_timer()
        target = request.uri if request is not None and request.uri else b"/"
        method = request.method if request is not None else b""
        self.outlet.send(self.site.gate.refusal_answer(refusal, target, method))
        if request is None or request is not self._parsing:
            self.close()
            return
        # Closing now, with the body still arriving, would reset the connection and lose the
        # answer at a client that writes its whole body before reading.
        self._phase = _LINGERING
        self._resume_reading()
        self._linger_timer = self.site.clock.callLater(LINGER_SECONDS, self.close)

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

    def _arm_head_timer(self) -> None:
        timeout = self.site.head_timeout
        if timeout > 0 and self._head_timer is None:
            self._head_timer = self.site.clock.callLater(timeout, self._head_too_slow)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._cancel(self._head_timer)
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        self._abort()

    def _arm_idle(self) -> None:
        timeout = self.site.idle_timeout
        if timeout > 0 and self._idle_timer is None and not self._ended:
            self._idle_timer = self.site.clock.callLater(timeout, self._idle)

    def _idle(self) -> None:
        self._idle_timer = None
        if self._in_flight:
            # A request in flight is never cut by the idle bound; its answer re-arms it.
            return
        # Every byte counts as activity (a body being uploaded slowly is not idle).
        left = self._last_data + self.site.idle_timeout - self.site.clock.seconds()
        if left > 0:
            self._idle_timer = self.site.clock.callLater(left, self._idle)
            return
        self.close()

    def _abort(self) -> None:
        self._abort_timer = None
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._idle_timer, self._linger_timer, self._abort_timer):
            if timer is not None:
                self._cancel(timer)
        self._head_timer = self._idle_timer = self._linger_timer = self._abort_timer = None

    @staticmethod
    def _cancel(timer: IDelayedCall) -> None:
        if timer.active():
            timer.cancel()


class FacadeSite(ServerFactory):
    """The factory every facade listener serves.

    :param gate: the facade: what it refuses at the head, how it words a refusal, and what
        serves the requests it admits.
    :param max_request_body: the body cap (``--max-request-body``).
    :param head_timeout: seconds a request head may take from its first byte (0: no bound).
    :param idle_timeout: seconds a kept-alive connection may wait for its next request
        (0: no bound).
    """

    noisy = False

    def __init__(
        self,
        gate: Gate,
        max_request_body: int,
        *,
        head_timeout: float = 30.0,
        idle_timeout: float = 300.0,
        clock: IReactorTime | None = None,
    ) -> None:
        if clock is None:
            from twisted.internet import reactor

            clock = IReactorTime(reactor)
        self.gate = gate
        self.max_request_body = max_request_body
        self.head_timeout = head_timeout
        self.idle_timeout = idle_timeout
        self.clock: IReactorTime = clock

    def buildProtocol(self, addr: IAddress | None) -> FacadeChannel:
        return FacadeChannel(self, addr)
