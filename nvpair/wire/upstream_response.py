# -*- test-case-name: tests.wire.test_upstream_conn -*-
"""An upstream answer as the rest of the proxy sees it: an ``IResponse`` whose body is
delivered to a protocol, and the push producer that protocol gets as its transport.

Both keep the shape of Twisted's client (``twisted.web._newclient.Response`` and its
``TransportProxyProducer``): the same ``length``, the same ``deliverBody`` states and errors,
the same end reasons, so :mod:`nvpair.dispatch.relay` and :mod:`nvpair.wire.bodies` cannot tell
them from Agent's. What reads the bytes off the socket is :mod:`nvpair.wire.upstream_conn`; it
reaches these objects only through :meth:`UpstreamResponse.data` and :meth:`UpstreamResponse.end`.
"""

from __future__ import annotations

from typing import cast

from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IProtocol, IPushProducer, ITransport
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from zope.interface import implementer

from nvpair.wire.upstream_framing import BadResponse, answer_head
from nvpair.wire.upstream_types import BodySource, Wire

#: Why every body that ended by its own framing ended: one ``Failure`` for all of them, as a
#: body's reader only asks what it holds (made per answer, as Twisted's client does, it cost
#: some 9,000 instructions; docs/performance.md#per-dispatch-overheads).
BODY_DONE = Failure(ResponseDone("Response body fully received"))


class ReadFlow:
    """Whether a connection reads its socket: a body's reader pauses and resumes it.

    A pause asked for while a read is being handled is applied once it has been: a body that
    ends in that very read needs none, and an idle connection must keep reading, or a server's
    close would go unnoticed. One per connection, for all its exchanges.

    :ivar feeding: a read is being handled now.
    :ivar paused: the socket is not being read.
    :ivar want_pause: a pause was asked for during this read.
    """

    __slots__ = ("_wire", "feeding", "paused", "want_pause")

    def __init__(self, wire: Wire) -> None:
        self._wire = wire
        self.feeding = False
        self.want_pause = False
        self.paused = False

    def pause(self) -> None:
        if self.feeding:
            self.want_pause = True
        elif not self.paused:
            self.paused = True
            self._wire.pauseProducing()

    def resume(self) -> None:
        self.want_pause = False
        if self.paused:
            self.paused = False
            self._wire.resumeProducing()

    def settle(self, body_open: bool) -> None:
        """A read has been handled: apply the pause asked for during it, if a body is still
        being read."""
        if self.want_pause:
            self.want_pause = False
            if body_open and not self.paused:
                self.paused = True
                self._wire.pauseProducing()

    def hold(self) -> None:
        """Nobody reads the body yet: pause once this read is handled (as Twisted does)."""
        self.want_pause = True


@implementer(IPushProducer)
class BodyTransport:
    """The transport a body protocol gets from ``deliverBody``: a push producer over the
    connection while the body lasts.

    Pausing stops reading the upstream socket, stopping closes the connection (it is then never
    reused). Once the body has ended every call is a no-op, so a late ``stopProducing`` can
    never close a connection that went back to the pool (as Twisted's
    ``TransportProxyProducer``).
    """

    __slots__ = ("_connection", "_flow")

    #: Twisted's body transport has it (LineReceiver reads it); it never changes.
    disconnecting = False

    def __init__(self, connection: BodySource, flow: ReadFlow) -> None:
        self._connection: BodySource | None = connection
        self._flow = flow

    def detach(self) -> None:
        """The body ended: stop acting on the connection."""
        self._connection = None

    def pauseProducing(self) -> None:
        if self._connection is not None:
            self._flow.pause()

    def resumeProducing(self) -> None:
        if self._connection is not None:
            self._flow.resume()

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
    :ivar to_close: the body runs to the connection's close.
    :ivar keep_alive: the connection may carry another exchange once the body has ended.
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
        "keep_alive",
        "length",
        "phrase",
        "previousResponse",
        "to_close",
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
        self.to_close = False
        self.keep_alive = False
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
        """The body bytes of one read; dropped once the body has ended."""
        if self._state == _Body.CONNECTED:
            assert self._protocol is not None
            self._protocol.dataReceived(data)
        elif self._state == _Body.INITIAL:
            self._held.append(data)

    def done(self) -> None:
        """The body ended by its own framing."""
        self.end(BODY_DONE)

    def failed(self, reason: Failure) -> None:
        """The body cannot be read to its end (bad framing, a reader that broke)."""
        self.end(Failure(ResponseFailed([reason])))

    def lost(self, reason: Failure) -> None:
        """The connection went before the body's framing ended it."""
        if self.to_close and reason.check(ConnectionDone) is not None:
            # The body ran to the close, as its framing said; only the close tells.
            self.end(Failure(PotentialDataLoss()))
        else:
            self.failed(reason)

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


_HTTP11 = (b"HTTP", 1, 1)
_HTTP10 = (b"HTTP", 1, 0)


def final_answer(
    code: int,
    http: str,
    phrase: bytes,
    fields: list[tuple[bytes, bytes]],
    head: bool,
    transport: BodyTransport,
) -> UpstreamResponse:
    """The answer a final (non-1xx) head makes, its body still to come.

    :param http: the version llhttp read (``"1.1"``).
    :param head: the request was a HEAD.
    :raises BadResponse: for a 101 (nothing here switches protocols), a status outside
        200-599, or a version other than HTTP/1.0 and 1.1.
    """
    if code == 101 or not 200 <= code <= 599:
        raise BadResponse(f"status {code} is not supported")
    if http == "1.1":
        version = _HTTP11
    elif http == "1.0":
        version = _HTTP10
    else:
        raise BadResponse(f"HTTP/{http} is not supported")
    headers, length, to_close, keep_alive = answer_head(
        fields, head, code == 204 or code == 304, version is _HTTP10
    )
    response = UpstreamResponse(version, code, phrase, headers, length, transport)
    response.to_close = to_close
    response.keep_alive = keep_alive
    return response
