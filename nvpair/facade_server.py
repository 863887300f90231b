# -*- test-case-name: tests.test_facade_head -*-
"""A facade's HTTP/1.1 server connection, on llhttp (``httptools``) inside Twisted's reactor.

twisted.web's server parses heads line by line in Python, builds a general-purpose request per
message and answers through layers a reverse proxy does not use; at the request rates a LAN
fleet sees, that machinery cost more than everything nvpair does per request (docs/performance.md).
This connection does only what a facade needs, and does it at the request head:

- HTTP's own rules are checked here (version, ``Host``, transfer coding, method, target form,
  the body cap); what a facade decides about the client (the loopback gate, Ollama's ``Host``
  guard) is asked of its :class:`Gate`, the one thing this module knows of a facade. A refusal
  is answered as soon as the head is parsed, naming what was wrong; the body is never read and
  the connection is closed (docs/robustness.md#refusals-at-the-request-head). So is a head the
  parser rejects, one over 16 KiB, or a chunked body that crosses the cap.
- A request head must be complete within ``head_timeout`` of its first byte, and a connection
  with no request in flight is closed after ``idle_timeout`` without a byte.
- Requests are answered one at a time, in order. A pipelined request waits, parsed, while the
  one before it is answered, and reading stops until then: a client cannot queue work faster
  than it is answered.
- The response's producer (the upstream connection) is paused while the client's socket is
  full, so a slow reader slows the engine rather than growing this process.
"""

from __future__ import annotations

import time
from email.utils import formatdate
from typing import Protocol as TypingProtocol
from urllib.parse import urlsplit

from attrs import frozen
from httptools.parser.errors import (
    HttpParserCallbackError,
    HttpParserError,
    HttpParserInvalidMethodError,
    HttpParserUpgrade,
)
from httptools.parser.parser import HttpRequestParser
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import (
    IAddress,
    IConsumer,
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

from nvpair.wire import send

#: Request line plus headers, as twisted.web bounds them: past this a head is 400. A chunked
#: body's trailer fields get the same bound.
MAX_HEAD_BYTES = 16 * 1024

#: Statuses whose answers have no body, whatever the headers say (RFC 9110 §6.4.1).
_BODILESS_STATUS = frozenset({204, 304})


@frozen
class Refusal:
    """Why a request is not served: the proxy's reason and, when the reason's own message
    would not say it, what was wrong (fixed text, never request content)."""

    reason: str
    message: str | None = None


HEAD_TOO_LARGE = Refusal("bad-request", "the request line and headers are over 16 KiB")
FRAMING_TOO_LARGE = Refusal(
    "bad-request", "the chunked body's framing or trailer fields are over 16 KiB"
)
BAD_VERSION = Refusal("bad-request", "only HTTP/1.0 and HTTP/1.1 are served")
NO_HOST = Refusal("bad-request", "an HTTP/1.1 request must carry a Host header")
SEVERAL_HOSTS = Refusal("bad-request", "a request must carry one Host header, not several")
BAD_TARGET = Refusal(
    "bad-request", "a target must be in origin form (/path) or absolute form (http://host/path)"
)
NOT_CHUNKED = Refusal("not-implemented", "the only request transfer coding implemented is chunked")
UNKNOWN_METHOD = Refusal("not-implemented", "the request method is not one this proxy can carry")
NO_TUNNEL = Refusal("not-implemented", "CONNECT is not served: this is no forward proxy")
TOO_LARGE = Refusal("body-too-large")
INTERNAL = Refusal("internal")

#: llhttp's reasons for a transfer coding it will not frame (RFC 9112 §6.3: chunked not last).
_CODING_ERRORS = frozenset(
    {"Invalid `Transfer-Encoding` header value", "Request has invalid `Transfer-Encoding`"}
)


def parse_refusal(error: HttpParserError) -> Refusal:
    """The refusal for bytes llhttp rejected, naming what it found wrong (its reasons are
    fixed text)."""
    if isinstance(error, HttpParserInvalidMethodError):
        return UNKNOWN_METHOD
    reason = str(error)
    if reason in _CODING_ERRORS:
        return NOT_CHUNKED
    return Refusal("bad-request", f"malformed request: {reason}")


def origin_form(target: bytes) -> bytes | None:
    """The request target as ``/path?query``, or None when it is neither form a proxy accepts.

    Origin form (``/api/chat``) is returned as it is. Absolute form
    (``http://127.0.0.1:11435/api/chat?x=1``, RFC 9112 §3.2.2) is reduced to its path and
    query: the upstream URL is always a node's base URL plus these, never client bytes
    appended to a host. Asterisk and authority forms, and anything else, are None.
    """
    if target.startswith(b"/"):
        return target
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

    def refusal_answer(self, refusal: Refusal, target: bytes, *, head_only: bool) -> bytes:
        """A whole answer to ``refusal``, in the facade's dialect, saying the connection closes.

        :param target: the request target as sent (``b"/"`` when no request line was read).
        :param head_only: the request was ``HEAD``: no body after the head.
        """

    def serve(self, request: FacadeRequest) -> None:
        """Answer a whole request (head and body) that passed every check at its head."""


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing: the connection is answered and closing."""


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
        "_received",
        "channel",
        "clientproto",
        "code",
        "code_message",
        "complete",
        "dispatched",
        "expects_continue",
        "finished",
        "head_bytes",
        "head_fed",
        "keep_alive",
        "method",
        "path",
        "refused",
        "requestHeaders",
        "responseHeaders",
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
        #: Answered at the head (or mid-body) with this reason; never handed to the facade.
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
        self._received = 0
        #: Head bytes seen by the callbacks, and raw bytes fed while the head was incomplete.
        self.head_bytes = 0
        self.head_fed = 0
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
        if not self.startedWriting:
            head = self._head()
            if self._no_body or not data:
                send(channel.transport, head)
                return
            send(channel.transport, head + (self._frame(data) if self._chunked else data))
            return
        if self._no_body or not data:
            return
        # A stream's later pieces are queued, not sent one by one: the pieces relayed from one
        # upstream read go out in one send at the reactor's turn
        # (docs/performance.md#writes-go-out-at-once).
        channel.transport.write(self._frame(data) if self._chunked else data)

    def finish(self) -> None:
        if self.finished:
            raise RuntimeError("finish() called twice")
        channel = self.channel
        if channel is None or channel.transport is None:
            return
        if not self.startedWriting:
            head = self._head()
            send(channel.transport, head + b"0\r\n\r\n" if self._chunked else head)
        elif self._chunked:
            send(channel.transport, b"0\r\n\r\n")
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
        received = self._received + len(data)
        self._received = received
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
        return b"".join(lines)

    @staticmethod
    def _frame(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)


@implementer(IPushProducer)
class FacadeChannel(Protocol):
    """One client connection to a facade (see the module docstring)."""

    # One per stream in flight: no per-instance dictionary (docs/performance.md#held-streams).
    __slots__ = (
        "_abort_timer",
        "_address",
        "_closing",
        "_halted",
        "_head_timer",
        "_idle_timer",
        "_last_data",
        "_parser",
        "_parsing",
        "_pending_refusal",
        "_reading_paused",
        "_requests",
        "connected",
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
        self._parser = HttpRequestParser(self)
        #: Requests in order: [0] is being answered (or parsed); the rest wait, parsed. A list:
        #: rarely more than one, where an empty deque is a 600-byte block.
        self._requests: list[FacadeRequest] = []
        self._parsing: FacadeRequest | None = None
        #: A refusal was written, or the connection is closing: nothing more is read.
        self._closing = False
        #: Stop parsing: a request behind the one being answered was refused.
        self._halted = False
        #: A refusal owed once the answer in progress is out, for bytes that began no request.
        self._pending_refusal: Refusal | None = None
        self._reading_paused = False
        self.write_paused = False
        self._head_timer: IDelayedCall | None = None
        self._idle_timer: IDelayedCall | None = None
        self._abort_timer: IDelayedCall | None = None
        self._last_data = 0.0

    # -- the connection ------------------------------------------------------------------------

    def connectionMade(self) -> None:
        transport = self.transport
        assert transport is not None
        no_delay = getattr(transport, "setTcpNoDelay", None)
        if no_delay is not None:
            # Answers are written whole or as stream events: Nagle would only delay them.
            no_delay(True)
        IConsumer(transport).registerProducer(self, True)
        self._arm_idle()

    def dataReceived(self, data: bytes) -> None:
        if self._closing or self._halted:
            # Answered and closing: nothing more is read (a real socket has stopped reading).
            return
        self._last_data = self.site.clock.seconds()
        if not self._requests and self._head_timer is None:
            self._arm_head_timer()
        parsing = self._parsing
        in_head = parsing is not None and parsing.method == b""
        try:
            self._parser.feed_data(data)
        except HttpParserCallbackError as error:
            if not isinstance(error.__context__, _Refused):
                self.log.failure("reading a request failed", Failure(error.__context__ or error))
                self._refuse_parsing(INTERNAL)
            return
        except HttpParserUpgrade:
            # An Upgrade (or CONNECT) is served as an ordinary request (no facade speaks
            # anything but HTTP/1.1) and the connection ends after it: what follows the head
            # is not HTTP/1.1 any more.
            self._halted = True
            if self._requests:
                self._requests[-1].keep_alive = False
            self._pause_reading()
            return
        except HttpParserError as error:
            self._refuse_parsing(parse_refusal(error))
            return
        if in_head and parsing is self._parsing and parsing is not None and parsing.method == b"":
            # Still in the same head: llhttp keeps partial names and values itself, so the
            # bound is checked on the bytes fed as well as on what the callbacks saw.
            parsing.head_fed += len(data)
            if parsing.head_fed > MAX_HEAD_BYTES:
                self._refuse_parsing(HEAD_TOO_LARGE)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._closing = True
        self._cancel_timers()
        requests, self._requests = self._requests, []
        for request in requests:
            request.lost(reason)

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
        request = FacadeRequest(self)
        self._parsing = request
        self._requests.append(request)
        if len(self._requests) > 1:
            # Pipelined behind an answer in progress: parsed, then nothing more is read
            # until its turn.
            self._pause_reading()

    def on_url(self, url: bytes) -> None:
        request = self._parsing
        assert request is not None
        request.uri += url
        if len(request.uri) > MAX_HEAD_BYTES:
            self._refuse_parsing(HEAD_TOO_LARGE)
            raise _Refused()

    def on_header(self, name: bytes, value: bytes) -> None:
        request = self._parsing
        assert request is not None
        request.head_bytes += len(name) + len(value) + 4
        if request.method:
            # A trailer field: dropped, never merged into the headers sent on.
            if request.head_bytes > MAX_HEAD_BYTES:
                self._refuse_parsing(FRAMING_TOO_LARGE)
                raise _Refused()
            return
        if request.head_bytes + len(request.uri) > MAX_HEAD_BYTES:
            self._refuse_parsing(HEAD_TOO_LARGE)
            raise _Refused()
        request.requestHeaders.addRawHeader(name, value)

    def on_headers_complete(self) -> None:
        request = self._parsing
        assert request is not None
        parser = self._parser
        request.method = parser.get_method()
        # Trailer fields, if any, get a bound of their own.
        request.head_bytes = 0
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            # llhttp reads any single-digit version; a facade speaks HTTP/1.x only.
            self._refuse_parsing(BAD_VERSION)
            raise _Refused()
        request.clientproto = b"HTTP/" + version.encode("ascii")
        # HTTP/1.0 connections are not kept alive, as twisted.web did before: one answer each.
        request.keep_alive = parser.should_keep_alive() and request.clientproto == b"HTTP/1.1"
        reason = self._head_refusal(request)
        if reason is not None:
            request.refused = reason
            if request is self._requests[0]:
                self._disarm_head_timer()
                self._answer_and_close(reason, request)
            else:
                self._halted = True
            raise _Refused()
        if request is self._requests[0]:
            self._disarm_head_timer()
        target = origin_form(request.uri)
        assert target is not None
        request.uri = target
        request.path = target.split(b"?", 1)[0]
        expect = request.requestHeaders.getRawHeaders(b"expect")
        if expect and request.clientproto == b"HTTP/1.1" and b"100-continue" in expect[0].lower():
            request.expects_continue = True
            if request is self._requests[0] and self.transport is not None:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _head_refusal(self, request: FacadeRequest) -> Refusal | None:
        """HTTP's own reasons to refuse a head, then the gate's, then the body cap."""
        headers = request.requestHeaders
        codings = headers.getRawHeaders(b"transfer-encoding")
        # llhttp decodes chunked, and would let another coding before it through as body.
        if codings is not None and (len(codings) != 1 or codings[0].strip().lower() != b"chunked"):
            return NOT_CHUNKED
        hosts = headers.getRawHeaders(b"host")
        if hosts is None:
            # RFC 9112 §3.2: an HTTP/1.1 request needs exactly one Host.
            if request.clientproto == b"HTTP/1.1":
                return NO_HOST
        elif len(hosts) > 1:
            return SEVERAL_HOSTS
        if request.method == b"CONNECT":
            return NO_TUNNEL
        if origin_form(request.uri) is None:
            return BAD_TARGET
        refusal = self.site.gate.refusal_at_head(
            self._address, request.uri, headers, request.method
        )
        if refusal is not None:
            return refusal
        declared = headers.getRawHeaders(b"content-length")
        # llhttp has already refused a malformed or conflicting length.
        if declared and int(declared[0]) > self.site.max_request_body:
            return TOO_LARGE
        return None

    def on_body(self, data: bytes) -> None:
        request = self._parsing
        assert request is not None
        if not request.take_body(data, self.site.max_request_body):
            request.refused = TOO_LARGE
            if request is self._requests[0]:
                self._answer_and_close(TOO_LARGE, request)
            else:
                self._halted = True
            raise _Refused()

    def on_message_complete(self) -> None:
        request = self._parsing
        assert request is not None
        self._parsing = None
        request.complete = True
        if request is self._requests[0]:
            self._dispatch(request)

    # -- answering ---------------------------------------------------------------------------

    def _dispatch(self, request: FacadeRequest) -> None:
        request.dispatched = True
        self.site.gate.serve(request)

    def answered(self, request: FacadeRequest) -> None:
        """``request``'s answer is complete: close, or move on to the next one."""
        if not self._requests or self._requests[0] is not request:
            return
        self._requests.pop(0)
        if not request.keep_alive:
            self.close()
            return
        # The idle bound counts from the last byte or the last answer, whichever is later.
        self._last_data = self.site.clock.seconds()
        self._arm_idle()
        if not self._requests:
            if self._pending_refusal is not None:
                self._answer_and_close(self._pending_refusal, None)
                return
            self._resume_reading()
            return
        following = self._requests[0]
        if following.refused is not None:
            self._answer_and_close(following.refused, following)
            return
        if len(self._requests) == 1:
            self._resume_reading()
        if following.complete:
            self._dispatch(following)
            return
        if following.method == b"":
            # Its head is still coming: its time starts now (the previous answer is out).
            self._arm_head_timer()
        elif following.expects_continue and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def close(self) -> None:
        """Close once what was written has gone out; a client that never reads it is aborted."""
        self._closing = True
        if self.transport is None:
            return
        if self._abort_timer is None:
            self._abort_timer = self.site.clock.callLater(self.abortTimeout, self._abort)
        # A TLS transport holds its close while a producer is registered with it.
        IConsumer(self.transport).unregisterProducer()
        self.transport.loseConnection()

    def _refuse_parsing(self, reason: Refusal) -> None:
        """The head or body cannot be read: answer ``reason`` now if nothing is being answered,
        else right after the answer in progress; nothing more is parsed either way."""
        if self._closing or self._halted:
            return
        front = self._requests[0] if self._requests else None
        if front is not None and front.dispatched:
            # Behind an answer in progress (pipelined): refused when its turn comes.
            behind = self._parsing
            if behind is not None and behind is not front:
                behind.refused = reason
            else:
                self._pending_refusal = reason
            self._halted = True
            self._pause_reading()
            return
        self._answer_and_close(reason, self._parsing)

    def _answer_and_close(self, reason: Refusal, request: FacadeRequest | None) -> None:
        if self._closing:
            return
        self._disarm_head_timer()
        target = request.uri if request is not None and request.uri else b"/"
        head_only = request is not None and request.method == b"HEAD"
        assert self.transport is not None
        self.transport.write(self.site.gate.refusal_answer(reason, target, head_only=head_only))
        self.close()

    # -- reading and timers ------------------------------------------------------------------

    def _pause_reading(self) -> None:
        # A connection already closing reads nothing more anyway; its transport may refuse a
        # pause once it is disconnecting (a CONNECT answered and closed within the same read).
        if not self._reading_paused and self.transport is not None and not self._closing:
            self._reading_paused = True
            self.transport.pauseProducing()  # type: ignore[attr-defined]

    def _resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None and not self._halted:
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
        if timeout > 0 and self._idle_timer is None and not self._closing:
            self._idle_timer = self.site.clock.callLater(timeout, self._idle)

    def _idle(self) -> None:
        self._idle_timer = None
        if self._requests and self._requests[0].dispatched:
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
        for timer in (self._head_timer, self._idle_timer, self._abort_timer):
            if timer is not None:
                self._cancel(timer)
        self._head_timer = self._idle_timer = self._abort_timer = None

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
