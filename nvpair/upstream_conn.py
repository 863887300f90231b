# -*- test-case-name: tests.test_upstream_conn -*-
"""One upstream HTTP/1.1 connection: a request written whole, its response parsed by llhttp.

Agent's client pays, per exchange, for a ``Request``, a body producer, a Deferred chain and a
line-based parser in Python (issue 11's profile: ``_newclient`` 10 %, the pool and Deferreds
more). This connection does one exchange at a time with the same contract and none of that:
the head and body go out in one ``transport.write``, and ``httptools`` (the llhttp binding
uvicorn uses) frames the answer.

What it hands back is an :class:`~twisted.web.iweb.IResponse` the rest of the proxy cannot
tell from Agent's: the same headers removed, the same ``length``, ``deliverBody`` with the
same states, a body transport that is a push producer over the connection, and the same
failure classes (``ResponseDone``, ``PotentialDataLoss``, ``ResponseFailed``,
``ResponseNeverReceived``), so :mod:`nvpair.relay` and :mod:`nvpair.bodies` keep working.

Parser callbacks only record; everything that runs other code (firing the request's Deferred,
delivering body bytes, ending the body, returning the connection to its pool) happens after
llhttp has returned, so nothing re-enters the parser.
"""

from __future__ import annotations

import enum
import re
from typing import Protocol as TypingProtocol
from typing import cast

from httptools.parser.parser import HttpResponseParser
from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IProtocol, IPushProducer, ITCPTransport, ITransport
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed, ResponseNeverReceived
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IResponse
from zope.interface import implementer

from nvpair.headers import connection_tokens
from nvpair.wire import send

#: The most head bytes (status line, fields, interim answers) read before the final answer's
#: head is complete; an engine must not make this process buffer without bound.
MAX_HEAD = 64 * 1024

#: ``(scheme, host, port)``: which idle connections may carry a request.
Key = tuple[bytes, bytes, int]

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_UNSAFE_VALUE = re.compile(rb"[\r\n\x00]")

#: The body's framing is this client's to write; a caller's own would contradict it.
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})

#: Response headers Twisted's client takes out of ``response.headers`` (its
#: ``HTTPParser.CONNECTION_CONTROL_HEADERS``): removed here too, so delivery forwards exactly
#: what it did. ``Content-Length`` becomes ``length`` (except in a HEAD answer).
_CONNECTION_CONTROL = frozenset(
    {
        b"content-length",
        b"connection",
        b"keep-alive",
        b"te",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-connection",
    }
)

_HTTP11 = (b"HTTP", 1, 1)
_HTTP10 = (b"HTTP", 1, 0)


class BadResponse(Exception):
    """The upstream's bytes are no HTTP/1.x answer this client accepts (inside
    ``ResponseNeverReceived`` or ``ResponseFailed``)."""


class _Stop(Exception):
    """Raised in a parser callback to stop llhttp; the reason is kept on the connection."""


def request_head(
    method: bytes, target: bytes, host: bytes, headers: Headers, length: int | None
) -> bytes:
    """The request line and header section of one request, as bytes ready to send.

    ``Host`` comes first (RFC 9110 §7.2) unless ``headers`` carries its own; ``Content-Length``
    is ``length`` when it is not None, and a caller's ``Content-Length`` or
    ``Transfer-Encoding`` is never sent. At least as strict as Twisted's ``Request``: the method
    must be a token, the target visible ASCII, names tokens, and no value may hold CR, LF or
    NUL (Twisted's ``Headers`` replaces CR and LF but keeps NUL).

    :raises ValueError: for anything that would not be a well-formed head.
    """
    if _TOKEN.fullmatch(method) is None:
        raise ValueError(f"invalid method {method!r}")
    if _TARGET.fullmatch(target) is None:
        raise ValueError(f"invalid request target {target!r}")
    fields: list[bytes] = []
    hosts = 0
    for name, values in headers.getAllRawHeaders():
        kind = _NAMES.get(name)
        if kind is None:
            kind = _name_kind(name)
        if kind is _Name.SKIP:
            continue
        if kind is _Name.HOST:
            hosts += len(values)
        for value in values:
            fields += (name, b": ", value, b"\r\n")
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    if not hosts:
        parts += (b"Host: ", host, b"\r\n")
    elif hosts != 1:
        raise ValueError("exactly one Host header is required")
    parts += fields
    if length is not None:
        parts.append(b"Content-Length: %d\r\n" % length)
    parts.append(b"\r\n")
    head = b"".join(parts)
    # Every line break in the head is one this function wrote: a CR, LF or NUL from a value
    # (or the host) would show as one too many, so three scans check every value at once.
    breaks = len(fields) // 4 + (2 if not hosts else 1) + (length is not None) + 1
    if head.count(b"\n") != breaks or head.count(b"\r") != breaks or b"\0" in head:
        raise ValueError("a header value (or the host) holds CR, LF or NUL")
    return head


class _Name(enum.Enum):
    SEND = "send"
    HOST = "host"
    SKIP = "skip"


#: Verdicts on header names seen before (names repeat: Headers canonicalizes them).
_NAMES: dict[bytes, _Name] = {}


def _name_kind(name: bytes) -> _Name:
    if _TOKEN.fullmatch(name) is None:
        raise ValueError(f"invalid header name {name!r}")
    lowered = name.lower()
    kind = _Name.SKIP if lowered in _FRAMING else _Name.HOST if lowered == b"host" else _Name.SEND
    if len(_NAMES) >= 1024:
        _NAMES.clear()
    _NAMES[name] = kind
    return kind


def response_headers(
    fields: list[tuple[bytes, bytes]], head: bool, named: set[bytes] | None = None
) -> Headers:
    """The headers a response exposes, from its raw fields in order.

    Twisted's client removes its connection-control headers (``Content-Length`` stays in the
    answer to a HEAD: it describes the GET body there); the proxy's client also removed the
    headers ``Connection`` names (RFC 9110 §7.6.1), which nobody downstream could tell apart
    once ``Connection`` itself is gone.

    :param head: the request was a HEAD.
    :param named: the ``Connection`` tokens, when the caller has them already.
    """
    if named is None:
        named = connection_tokens(v for n, v in fields if n.lower() == b"connection")
    headers = Headers()
    for name, value in fields:
        lowered = name.lower()
        if lowered in named:
            continue
        if lowered in _CONNECTION_CONTROL and not (head and lowered == b"content-length"):
            continue
        # llhttp strips the leading whitespace of a value but keeps the trailing.
        headers.addRawHeader(lowered, value.rstrip(b" \t"))
    return headers


class _Transport(TypingProtocol):
    """What a connection uses of its transport (TCP, or TLS over it)."""

    def write(self, data: bytes) -> None: ...

    def loseConnection(self) -> None: ...

    def abortConnection(self) -> None: ...

    def pauseProducing(self) -> None: ...

    def resumeProducing(self) -> None: ...


class Owner(TypingProtocol):
    """Where a connection goes between exchanges (the pool)."""

    def put(self, connection: UpstreamConnection) -> None:
        """The exchange ended cleanly: keep ``connection`` for another, or close it."""

    def drop(self, connection: UpstreamConnection) -> None:
        """``connection`` can no longer be used: forget it if it is idle."""


@implementer(IPushProducer)
class BodyTransport:
    """The transport a body protocol gets from ``deliverBody``: a push producer over the
    connection while the body lasts.

    Pausing stops reading the upstream socket, stopping closes the connection (it is then never
    reused). Once the body has ended every call is a no-op, so a late ``stopProducing`` can
    never close a connection that went back to the pool (as Twisted's
    ``TransportProxyProducer``).
    """

    __slots__ = ("_connection",)

    #: Twisted's body transport has it (LineReceiver reads it); it never changes.
    disconnecting = False

    def __init__(self, connection: UpstreamConnection) -> None:
        self._connection: UpstreamConnection | None = connection

    def detach(self) -> None:
        """The body ended: stop acting on the connection."""
        self._connection = None

    def pauseProducing(self) -> None:
        if self._connection is not None:
            self._connection.pause_body()

    def resumeProducing(self) -> None:
        if self._connection is not None:
            self._connection.resume_body()

    def stopProducing(self) -> None:
        if self._connection is not None:
            self._connection.stop_body()

    def loseConnection(self) -> None:
        """As ``stopProducing`` (Twisted's body transport offers both)."""
        self.stopProducing()

    def abortConnection(self) -> None:
        """Close at once, unsent bytes dropped (``readBody`` cancels with it)."""
        if self._connection is not None:
            self._connection.stop_body(abort=True)


class _Body:
    """Where a response's body stands (``twisted.web._newclient.Response``'s states)."""

    #: No protocol yet: bytes are held, the upstream is paused.
    INITIAL = 0
    #: Bytes go to the protocol as they arrive.
    CONNECTED = 1
    #: Ended before a protocol came: held bytes and the end wait for ``deliverBody``.
    DEFERRED_CLOSE = 2
    #: Delivered and ended.
    FINISHED = 3


@implementer(IResponse)
class UpstreamResponse:
    """An upstream answer whose head has arrived; its body follows through
    :meth:`deliverBody`.

    :ivar length: the ``Content-Length``, 0 for a HEAD, 204 or 304 answer, else
        ``UNKNOWN_LENGTH``.
    """

    # One per stream in flight: no per-instance dictionary (docs/performance.md#held-streams).
    __slots__ = (
        "_as_transport",
        "_held",
        "_protocol",
        "_reason",
        "_state",
        "code",
        "headers",
        "length",
        "phrase",
        "previousResponse",
        "transport",
        "version",
    )

    #: No ``IClientRequest`` is kept: nothing reads it.
    request = None

    def __init__(
        self,
        version: tuple[bytes, int, int],
        code: int,
        phrase: bytes,
        headers: Headers,
        length: int | str,
        transport: BodyTransport,
    ) -> None:
        self.version = version
        self.code = code
        self.phrase = phrase
        self.headers = headers
        self.length = length
        self.previousResponse: IResponse | None = None
        self.transport = transport
        # Twisted hands body protocols a push producer as their "transport" too.
        self._as_transport = cast(ITransport, transport)
        self._state = _Body.INITIAL
        self._held: list[bytes] = []
        self._protocol: IProtocol | None = None
        self._reason: Failure | None = None

    def deliverBody(self, protocol: IProtocol) -> None:
        """Connect ``protocol`` to the body: held bytes first, then the rest as it comes.

        :raises RuntimeError: when a protocol was connected already, or the body was
            delivered already (as Twisted's response does).
        """
        state = self._state
        if state == _Body.INITIAL:
            protocol.makeConnection(self._as_transport)
            self._protocol = protocol
            self._state = _Body.CONNECTED
            held, self._held = self._held, []
            for data in held:
                protocol.dataReceived(data)
            # After the state change: resuming may deliver more, or end the body, at once.
            self.transport.resumeProducing()
        elif state == _Body.DEFERRED_CLOSE:
            protocol.makeConnection(self._as_transport)
            held, self._held = self._held, []
            for data in held:
                protocol.dataReceived(data)
            self._state = _Body.FINISHED
            assert self._reason is not None
            protocol.connectionLost(self._reason)
        elif state == _Body.CONNECTED:
            raise RuntimeError(
                f"Response already has protocol {self._protocol!r}, cannot deliverBody again"
            )
        else:
            raise RuntimeError("Response already finished, cannot deliverBody now.")

    def setPreviousResponse(self, response: IResponse) -> None:
        self.previousResponse = response

    # -- the connection's side -------------------------------------------------------------

    def connected(self) -> bool:
        """Whether a protocol is reading the body now."""
        return self._state == _Body.CONNECTED

    def data(self, data: bytes) -> None:
        if self._state == _Body.CONNECTED:
            assert self._protocol is not None
            self._protocol.dataReceived(data)
        elif self._state == _Body.INITIAL:
            self._held.append(data)

    def end(self, reason: Failure) -> None:
        self.transport.detach()
        if self._state == _Body.CONNECTED:
            protocol, self._protocol = self._protocol, None
            self._state = _Body.FINISHED
            assert protocol is not None
            protocol.connectionLost(reason)
        elif self._state == _Body.INITIAL:
            self._reason = reason
            self._state = _Body.DEFERRED_CLOSE


def _response_done() -> Failure:
    return Failure(ResponseDone("Response body fully received"))


class UpstreamConnection(Protocol):
    """One connection to an engine, carrying one exchange at a time.

    :meth:`send` writes a whole request and fires its Deferred with the response once the head
    has arrived (1xx interim answers are skipped). The connection goes back to its
    :class:`Owner` only when the response ended cleanly by its own framing, allows keep-alive,
    nothing followed it, and no reader stopped it; anything else closes it.

    :ivar owner: the pool it belongs to (set when it is adopted).
    :ivar key: where it leads.
    :ivar idle: whether it sits in its pool now.
    :ivar idle_since: when it last went idle.
    """

    # One per stream in flight: no per-instance dictionary (docs/performance.md#held-streams).
    __slots__ = (
        "_chunks",
        "_close_delimited",
        "_closing",
        "_deferred",
        "_done",
        "_extra",
        "_failure",
        "_feeding",
        "_fields",
        "_head",
        "_head_bytes",
        "_head_size",
        "_interim",
        "_keep_alive",
        "_lost",
        "_parser",
        "_paused",
        "_pending",
        "_phrase",
        "_response",
        "_stopped",
        "_waiters",
        "_want_pause",
        "_wire",
        "connected",
        "factory",
        "idle",
        "idle_since",
        "key",
        "owner",
        "transport",
    )

    def __init__(self) -> None:
        # Slots, where the Protocol base has class defaults.
        self.transport: ITransport | None = None
        self.connected = 0
        self.factory = None
        self._wire: _Transport
        self.owner: Owner | None = None
        self.key: Key = (b"", b"", 0)
        self.idle = False
        self.idle_since = 0.0
        self._parser: HttpResponseParser | None = None
        self._deferred: Deferred[IResponse] | None = None
        self._head = False
        # Head in progress (reset at each message's start).
        self._fields: list[tuple[bytes, bytes]] = []
        self._phrase = b""
        self._interim = False
        self._head_bytes = 0
        self._head_size = 0
        # The answer: built by the parser callbacks, fired after them.
        self._pending: UpstreamResponse | None = None
        self._response: UpstreamResponse | None = None
        self._chunks: list[bytes] = []
        self._done = False
        self._extra = False
        self._failure: Exception | None = None
        self._keep_alive = False
        self._close_delimited = False
        # Reading and closing.
        self._stopped = False
        self._feeding = False
        self._want_pause = False
        self._paused = False
        self._closing = False
        self._lost = False
        self._waiters: list[Deferred[None]] = []

    # -- the pool's side -------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        """Whether another request may be sent on it."""
        return not (self._lost or self._closing)

    def send(self, method: bytes, data: bytes, deferred: Deferred[IResponse]) -> None:
        """Write ``data`` (a whole request to ``method``) and fire ``deferred`` with its
        response's head, or fail it.

        ``deferred`` must have :meth:`cancel` as its canceller: cancelling it before the head
        aborts the connection.
        """
        self._parser = HttpResponseParser(self)
        self._deferred = deferred
        self._head = method == b"HEAD"
        self._head_bytes = 0
        self._head_size = 0
        self._interim = False
        self._done = False
        self._extra = False
        self._failure = None
        self._close_delimited = False
        self._stopped = False
        self._want_pause = False
        # Head and body in one write: one write-interest toggle in the reactor, not several.
        # Once written the request is whole and in order on the wire, so an answer that
        # arrives before the kernel has sent all of it is still the answer to all of it.
        send(self._wire, data)

    def cancel(self, deferred: Deferred[IResponse]) -> None:
        """Canceller of :meth:`send`'s Deferred: before the head, abort the connection (the
        Deferred then fails with ``CancelledError``)."""
        if self._deferred is not deferred:
            return
        self._deferred = None
        self._parser = None
        self._closing = True
        self._wire.abortConnection()

    def close(self) -> Deferred[None]:
        """Close (an idle connection); fires once it is closed."""
        if self._lost:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._waiters.append(waiter)
        if not self._closing:
            self._closing = True
            self._wire.loseConnection()
        return waiter

    # -- IProtocol -------------------------------------------------------------------------

    def connectionMade(self) -> None:
        self._wire = cast(_Transport, self.transport)
        # As Twisted's client: a request is one write, and Nagle would hold a small one back.
        if ITCPTransport.providedBy(self.transport):
            self.transport.setTcpNoDelay(True)

    def dataReceived(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:
            # Nothing was asked: bytes now mean the server's framing and ours disagree.
            if not self._closing:
                self._closing = True
                if self.owner is not None:
                    self.owner.drop(self)
                self._wire.loseConnection()
            return
        if self._response is None:
            self._head_bytes += len(data)
        problem: Exception | None = None
        self._feeding = True
        try:
            try:
                parser.feed_data(data)
            except Exception as error:
                problem = self._failure or error
            self._after_feed(problem)
        finally:
            self._feeding = False
        if self._want_pause:
            self._want_pause = False
            if self._response is not None and not self._paused:
                self._paused = True
                self._wire.pauseProducing()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._lost = True
        self._parser = None
        self._pending = None
        deferred, self._deferred = self._deferred, None
        response, self._response = self._response, None
        if deferred is not None:
            deferred.errback(Failure(ResponseNeverReceived([reason])))
        elif response is not None:
            if self._close_delimited and reason.check(ConnectionDone) is not None:
                # The body ran to the close, as its framing said; only the close tells.
                end = Failure(PotentialDataLoss())
            else:
                end = Failure(ResponseFailed([reason]))
            response.end(end)
        if self.owner is not None:
            self.owner.drop(self)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)

    # -- llhttp callbacks: record only -----------------------------------------------------

    def on_message_begin(self) -> None:
        if self._done or self._pending is not None or self._response is not None:
            self._extra = True
            return
        self._fields.clear()
        self._phrase = b""

    def on_status(self, status: bytes) -> None:
        if self._pending is None and self._response is None:
            self._phrase += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._pending is not None or self._response is not None:
            # Trailer fields of a chunked body (Twisted drops them too), or another message.
            return
        self._head_size += len(name) + len(value)
        if self._head_size > MAX_HEAD:
            self._failure = BadResponse(f"response head over {MAX_HEAD} bytes")
            raise _Stop()
        self._fields.append((name, value))

    def on_headers_complete(self) -> None:
        if self._pending is not None or self._response is not None:
            return
        parser = self._parser
        assert parser is not None
        code = parser.get_status_code()
        if 100 <= code < 200 and code != 101:
            # Informational (100, 103): not the answer, which is still to come.
            self._interim = True
            return
        if code == 101 or not 200 <= code <= 599:
            self._failure = BadResponse(f"status {code} is not supported")
            raise _Stop()
        http = parser.get_http_version()
        if http == "1.1":
            version = _HTTP11
        elif http == "1.0":
            version = _HTTP10
        else:
            self._failure = BadResponse(f"HTTP/{http} is not supported")
            raise _Stop()
        fields = self._fields
        tokens: set[bytes] = set()
        length: int | str = UNKNOWN_LENGTH
        coding = b""
        for name, value in fields:
            lowered = name.lower()
            if lowered == b"connection":
                tokens |= connection_tokens((value,))
            elif lowered == b"content-length":
                length = int(value)  # llhttp accepted it: digits, one value
            elif lowered == b"transfer-encoding":
                coding = value
        close_delimited = False
        if self._head or code in (204, 304):
            # No body, whatever the headers say (RFC 9112 §6.3); llhttp knows no HEAD.
            length = 0
            self._done = True
        elif coding:
            length = UNKNOWN_LENGTH
            # Chunked only when it is the final coding; else the body runs to the close.
            close_delimited = coding.rsplit(b",", 1)[-1].strip().lower() != b"chunked"
        elif length == UNKNOWN_LENGTH:
            close_delimited = True
        self._close_delimited = close_delimited
        self._keep_alive = not close_delimited and (
            b"keep-alive" in tokens if version is _HTTP10 else b"close" not in tokens
        )
        self._pending = UpstreamResponse(
            version,
            code,
            self._phrase,
            response_headers(fields, self._head, tokens),
            length,
            BodyTransport(self),
        )
        # Now in the response's headers: a stream held open should not keep both copies.
        fields.clear()

    def on_body(self, body: bytes) -> None:
        if self._done:
            self._extra = True
        else:
            self._chunks.append(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
        else:
            self._done = True

    # -- after the parser returned ---------------------------------------------------------

    def _after_feed(self, problem: Exception | None) -> None:
        pending = self._pending
        if pending is not None:
            self._pending = None
            self._response = pending
            deferred, self._deferred = self._deferred, None
            if deferred is not None:
                deferred.callback(pending)
            if self._lost:
                return
        response = self._response
        if response is None:
            if problem is not None:
                self._fail_head(problem)
            elif self._head_bytes > MAX_HEAD:
                self._fail_head(BadResponse(f"response head over {MAX_HEAD} bytes"))
            return
        if self._chunks:
            chunks, self._chunks = self._chunks, []
            for chunk in chunks:
                try:
                    response.data(chunk)
                except Exception:
                    # The reader broke: as Twisted, the exchange ends with its error.
                    self._fail_body(response, Failure())
                    return
                if self._lost or self._response is not response:
                    return
        if self._done:
            if problem is not None:
                # Bytes past the end that llhttp refused: a confused server.
                self._extra = True
            self._finish(response)
        elif problem is not None:
            self._fail_body(response, Failure(problem))
        elif not response.connected():
            # Nobody reads the body yet: hold the upstream where it is (as Twisted does).
            self._want_pause = True

    def _fail_head(self, problem: Exception) -> None:
        deferred, self._deferred = self._deferred, None
        self._parser = None
        self._closing = True
        self._wire.abortConnection()
        if deferred is not None:
            deferred.errback(Failure(ResponseNeverReceived([Failure(problem)])))

    def _fail_body(self, response: UpstreamResponse, reason: Failure) -> None:
        self._response = None
        self._parser = None
        self._closing = True
        self._wire.abortConnection()
        response.end(Failure(ResponseFailed([reason])))

    def _finish(self, response: UpstreamResponse) -> None:
        """The body ended by its framing: reuse or close, then tell the reader (last: it may
        send the next request on this very connection)."""
        self._response = None
        self._parser = None
        owner = self.owner
        if owner is not None and self._keep_alive and not (self._extra or self._stopped):
            self._want_pause = False
            if self._paused:
                # An idle connection must read, or a server's close would go unnoticed.
                self._paused = False
                self._wire.resumeProducing()
            owner.put(self)
        elif not self._closing:
            self._closing = True
            self._wire.loseConnection()
        response.end(_response_done())

    # -- the body transport's side ---------------------------------------------------------

    def pause_body(self) -> None:
        if self._feeding:
            # Applied once this read is handled: a body that ends in it needs no pause.
            self._want_pause = True
        elif not self._paused:
            self._paused = True
            self._wire.pauseProducing()

    def resume_body(self) -> None:
        self._want_pause = False
        if self._paused:
            self._paused = False
            self._wire.resumeProducing()

    def stop_body(self, abort: bool = False) -> None:
        """The reader wants no more: close; the body ends when the connection has gone."""
        self._stopped = True
        if abort:
            self._closing = True
            self._wire.abortConnection()
        elif not self._closing:
            self._closing = True
            self._wire.loseConnection()


class ConnectionFactory(Factory):
    """Builds :class:`UpstreamConnection`s for the endpoints."""

    # One dial per connection: at Twisted's default every one would log "Starting factory".
    noisy = False

    def buildProtocol(self, addr: object) -> UpstreamConnection:
        return UpstreamConnection()
