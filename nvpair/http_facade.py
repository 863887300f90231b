"""One engine's facade: the HTTP resource that admits a request and hands it to the request path.

Admission is everything decided from the request alone: the loopback gate, the route class,
the body cap, the model named in the body. A request refused here (400, 403, 413) never
becomes a workload.
"""

from __future__ import annotations

import io
from collections.abc import Callable

from attrs import frozen
from OpenSSL import crypto
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import http, server
from twisted.web.http_headers import Headers
from twisted.web.resource import Resource

from nvpair.admission import (
    BadBody,
    is_loopback,
    model_from_body,
    ollama_host_allowed,
    origin_form,
    target_host,
)
from nvpair.cluster import Membership
from nvpair.engines import Engine, RouteClass
from nvpair.logs import debug_enabled
from nvpair.proxy_answers import head_refusal, write_error
from nvpair.web import ProxiedRequest


class FacadeChannel(http.HTTPChannel):
    """An HTTP connection that refuses at the request head and bounds slow heads.

    Two things twisted.web does not do for a proxy that admits untrusted bytes:

    - Refusals the head decides (``forbidden``, ``forbidden-host``, ``bad-request``, a declared
      ``body-too-large``) are answered as soon as the head is parsed; the body is never read
      and the connection is closed (docs/robustness.md).
    - A request head must be complete within ``head_timeout`` of its first byte, so a client
      trickling a head one byte at a time cannot hold a connection (the idle timeout, which
      every byte resets, would not catch it).
    """

    site: FacadeSite
    _head_timer: IDelayedCall | None = None
    #: Between the end of a head and the end of its body: bytes then are body, not a new head.
    _reading_body = False
    #: A refusal was written and the connection is closing.
    _closing = False

    def dataReceived(self, data: bytes) -> None:
        if self._closing:
            # Answered and closing: nothing more is read (a real socket has stopped reading).
            return
        if self._head_timer is None and not self._reading_body and not self._handlingRequest:
            timeout = self.site.head_timeout
            if timeout > 0:
                self._head_timer = self.callLater(timeout, self._head_too_slow)
        super().dataReceived(data)

    def allHeadersReceived(self) -> None:
        self._disarm_head_timer()
        self._reading_body = True
        request: FacadeRequest = self.requests[-1]
        # The request line as parsed by HTTPChannel.lineReceived (its own attributes; pinned by
        # tests/test_facade_head.py).
        target: bytes = self._path
        assert self.transport is not None
        reason = self.site.facade.refusal_at_head(
            self.transport.getPeer(), target, request.requestHeaders, self.length
        )
        if reason is not None:
            self.refuse(request, reason)
            return
        super().allHeadersReceived()

    def allContentReceived(self) -> None:
        self._reading_body = False
        super().allContentReceived()

    def refuse(self, request: FacadeRequest, reason: str) -> None:
        """Answer ``reason`` now, read nothing more, and close the connection.

        Called while the request's head (or body) is being parsed, so the request line is
        still the channel's own.
        """
        request.refused = True
        self._answer_and_close(reason)

    def _respondToBadRequestAndDisconnect(self) -> None:
        # twisted.web answers a head it cannot parse (a bad version, a header with no colon,
        # conflicting lengths, a bad chunk size) with a bare 400; ours says why, like every
        # answer the proxy makes itself (docs/request-path.md#proxy-generated-answers).
        if self.requests:
            self.requests[-1].refused = True
        self._answer_and_close("bad-request")

    def lineLengthExceeded(self, line: bytes) -> None:
        # A request line or header past 16 KiB: twisted.web would close without a word.
        self._answer_and_close("bad-request")

    def _answer_and_close(self, reason: str) -> None:
        if self._closing:
            return
        self._closing = True
        target = getattr(self, "_path", b"/")
        path = (origin_form(target) or b"/").split(b"?", 1)[0].decode("latin-1")
        head_only = getattr(self, "_command", None) == b"HEAD"
        assert self.transport is not None
        self.transport.write(
            head_refusal(self.site.facade.engine, path, reason, head_only=head_only)
        )
        self.loseConnection()

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            if self._head_timer.active():
                self._head_timer.cancel()
            self._head_timer = None

    def timeoutConnection(self) -> None:
        # The idle timeout (no request in flight): Twisted's own logs every such close at
        # info, which is per-connection detail (docs/README.md#logging). Like Twisted's, a
        # client that never reads what was already written is aborted after abortTimeout,
        # else the graceful close would wait on it forever.
        if self.abortTimeout is not None:
            self._abortingCall = self.callLater(self.abortTimeout, self._abort_idle)
        self.loseConnection()

    def _abort_idle(self) -> None:
        self._abortingCall = None
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._disarm_head_timer()
        super().connectionLost(reason)


class FacadeRequest(server.Request):
    """A request whose body is held in memory and capped at the site's ``max_request_body``.

    twisted.web reads a whole body before rendering and has no cap of its own; bodies here are
    JSON prompts that every failover attempt re-sends, so memory is the right home for them,
    and the cap is what keeps that safe. A declared length over the cap is refused at the head;
    a chunked body is refused the moment it crosses the cap, and nothing more is read.
    """

    #: Answered at the head (or mid-body): the channel has closed; never rendered.
    refused = False
    _received = 0
    _body: io.BytesIO
    channel: FacadeChannel

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        # Bodies are forwarded verbatim: never parse form or multipart uploads into args
        # (it costs a MIME parse per request and would refuse a malformed upload the engine
        # should be the one to judge).
        self._parsePOSTFormSubmission = False

    def gotLength(self, length: int | None) -> None:
        self._body = io.BytesIO()
        self.content = self._body

    def handleContentChunk(self, data: bytes) -> None:
        if self.refused:
            return
        self._received += len(data)
        channel = self.channel
        if self._received > channel.site.max_request_body:
            self._body = io.BytesIO()
            channel.refuse(self, "body-too-large")
            return
        self._body.write(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if self.refused:
            return
        # The head check let only origin or absolute form through; routing sees origin form.
        super().requestReceived(command, origin_form(path) or path, version)

    def body(self) -> bytes:
        """The whole request body, as received (within the cap)."""
        return self._body.getvalue()

    @property
    def connected(self) -> bool:
        """The client connection is still there (a lost one drops its channel)."""
        return self.channel is not None

    def abort(self) -> None:
        """Drop the client connection at once (a client that stopped reading)."""
        channel = self.channel
        if channel is not None and channel.transport is not None:
            channel.transport.abortConnection()  # type: ignore[attr-defined]


class FacadeSite(server.Site):
    """The Site every facade listener serves.

    :param max_request_body: the body cap (``--max-request-body``).
    :param head_timeout: seconds a request head may take from its first byte (0: no bound).
    :param idle_timeout: seconds a kept-alive connection may wait for its next request
        (0: no bound).
    """

    requestFactory = FacadeRequest
    # Twisted's default wraps the channel to negotiate HTTP/2 over TLS ALPN, which no facade
    # offers; the plain channel is one indirection less per call on the hot path.
    protocol = FacadeChannel  # type: ignore[assignment]

    def __init__(
        self,
        resource: Facade,
        max_request_body: int,
        *,
        head_timeout: float = 30.0,
        idle_timeout: float = 300.0,
        clock: IReactorTime | None = None,
    ) -> None:
        super().__init__(resource, timeout=idle_timeout or None, reactor=clock)
        self.facade = resource
        resource.site_max_body = max_request_body
        self.max_request_body = max_request_body
        self.head_timeout = head_timeout
        self.noisy = False

    def log(self, request: object) -> None:
        """No access log: paths are fine to log but per-request lines belong at debug level
        (docs/README.md#logging), and the request path logs its own operational record there."""


def is_preflight(request: FacadeRequest) -> bool:
    """A CORS preflight: ``OPTIONS`` carrying ``Origin`` and ``Access-Control-Request-Method``."""
    headers = request.requestHeaders
    return bool(
        request.method == b"OPTIONS"
        and headers.hasHeader(b"origin")
        and headers.hasHeader(b"access-control-request-method")
    )


@frozen
class Admitted:
    """A request that passed admission, ready for the request path.

    :ivar model: the model as named in the body (None: the body names none).
    :ivar model_key: the engine's comparison key for ``model``.
    """

    engine: Engine
    route: RouteClass
    method: bytes
    path: str
    uri: bytes
    body: bytes
    model: str | None
    model_key: str | None


class RequestHandler:
    """What a facade hands admitted requests to (the request path)."""

    def handle(self, admitted: Admitted, request: ProxiedRequest) -> Deferred[None]:
        raise NotImplementedError


class Facade(Resource):
    """The leaf resource of one engine's listener.

    :param engine: the engine whose dialect this facade speaks.
    :param handler: the request path.
    """

    isLeaf = True
    log = Logger()

    def __init__(
        self,
        engine: Engine,
        handler: RequestHandler,
        *,
        peer: Callable[[], Membership | None] | None = None,
    ) -> None:
        """:param peer: serve the cluster personality with this live membership: every request
        is a pinned peer's and goes to the local engine as it is."""
        super().__init__()
        self.engine = engine
        self._handler = handler
        self._peer = peer
        #: Set by the FacadeSite this facade is served by.
        self.site_max_body = 0

    def render(self, request: FacadeRequest) -> object:
        # Pass the engine's headers through as they are: no invented Content-Type, no
        # "Server: TwistedWeb" on an engine's answer.
        request.defaultContentType = None
        request.responseHeaders.removeHeader(b"server")
        try:
            return self._admit(request)
        except Exception:
            self.log.failure("admitting a request failed", engine=self.engine.id)
            if not request.startedWriting:
                write_error(request, self.engine, "internal")
            return server.NOT_DONE_YET

    def refusal_at_head(
        self, client: object, target: bytes, headers: Headers, length: int | None
    ) -> str | None:
        """The reason to refuse a request from its head alone, or None to read its body.

        :param client: the peer address of the connection.
        :param target: the request target as sent.
        :param length: the declared ``Content-Length`` (None: chunked or none).
        """
        if self._peer is None and not is_loopback(client):
            return "forbidden"
        if origin_form(target) is None:
            return "bad-request"
        hosts = headers.getRawHeaders(b"host", [])
        if len(hosts) > 1:
            # RFC 9112 §3.2: a request with more than one Host is answered 400.
            return "bad-request"
        guarded = self._peer is None and self.engine.host_guard
        if guarded and not ollama_host_allowed(target_host(target, hosts[0] if hosts else None)):
            return "forbidden-host"
        if length is not None and length > self.site_max_body:
            return "body-too-large"
        return None

    def _admit(self, request: FacadeRequest) -> object:
        engine = self.engine
        if self._peer is not None and not self._still_pinned(request):
            return server.NOT_DONE_YET
        path = request.path.decode("latin-1")
        body = request.body()
        if self._peer is not None:
            route, model = RouteClass.PEER, None
        else:
            route = (
                RouteClass.PREFLIGHT
                if is_preflight(request)
                else engine.classify(request.method, path)
            )
            try:
                model = model_from_body(engine, route, path, body)
            except BadBody as refused:
                write_error(request, engine, refused.reason)
                return server.NOT_DONE_YET
        admitted = Admitted(
            engine=engine,
            route=route,
            method=request.method,
            path=path,
            uri=request.uri,
            body=body,
            model=model,
            model_key=None if model is None else engine.model_key(model),
        )
        if debug_enabled():
            self.log.debug(
                "{method} {path} route={route} model={model}",
                engine=engine.id,
                method=request.method.decode("latin-1"),
                path=path,
                route=route.value,
                model=model,
            )
        d = self._handler.handle(admitted, request)
        d.addErrback(self._contained, request)
        return server.NOT_DONE_YET

    def _still_pinned(self, request: FacadeRequest) -> bool:
        """Membership and pins are checked per request, not only at the handshake: a
        connection admitted before this node left the cluster (or before the peer's pin was
        removed) carries nothing further. The connection is dropped, which the peer sees as a
        transport failure and fails over from."""
        assert self._peer is not None
        membership = self._peer()
        transport = request.channel.transport if request.channel is not None else None
        # TLSMemoryBIOProtocol has getPeerCertificate but declares no ISSLTransport.
        peer_certificate = getattr(transport, "getPeerCertificate", None)
        certificate = peer_certificate() if peer_certificate is not None else None
        if (
            membership is not None
            and isinstance(certificate, crypto.X509)
            and membership.pinned(certificate) is not None
        ):
            return True
        # Per-request detail stays below info (docs/README.md#logging); the membership change itself
        # is logged at info by the cluster watch.
        self.log.debug(
            "dropped a peer request: no longer a member or not pinned", engine=self.engine.id
        )
        request.abort()
        return False

    def _contained(self, failure: Failure, request: FacadeRequest) -> None:
        """An unexpected failure answers this request 500 and touches nothing else
        (docs/request-path.md#admission)."""
        self.log.failure("handling a request failed", failure, engine=self.engine.id)
        if request.finished or request.channel is None:
            return
        if not request.startedWriting:
            write_error(request, self.engine, "internal")
        else:
            request.loseConnection()
