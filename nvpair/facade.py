"""One engine's facade: the HTTP resource that admits a request and hands it to the request path.

Admission is everything decided from the request alone: the loopback gate, the route class,
the body cap, the model named in the body. A request refused here (400, 403, 413) never
becomes a workload.
"""

from __future__ import annotations

import functools
import io
import ipaddress
import json
from collections.abc import Callable
from typing import Any

from attrs import frozen
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import server
from twisted.web.resource import Resource

from nvpair.answers import write_error
from nvpair.cluster import Membership
from nvpair.engines import Engine, RouteClass
from nvpair.headers import end_to_end
from nvpair.logs import debug_enabled


class FacadeRequest(server.Request):
    """A request whose body is held in memory and capped at the site's ``max_request_body``.

    twisted.web reads a whole body before rendering and has no cap of its own; bodies here are
    JSON prompts that every failover attempt re-sends, so memory is the right home for them,
    and the cap is what keeps that safe. Past the cap the rest is discarded, not stored.
    """

    too_large = False
    _received = 0
    _body: io.BytesIO

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Bodies are forwarded verbatim: never parse form or multipart uploads into args
        # (it costs a MIME parse per request and would refuse a malformed upload the engine
        # should be the one to judge).
        self._parsePOSTFormSubmission = False

    def _cap(self) -> int:
        site: Any = getattr(self.channel, "site", None)
        return int(site.max_request_body)

    def gotLength(self, length: int | None) -> None:
        self._body = io.BytesIO()
        self.content = self._body
        if length is not None and length > self._cap():
            self.too_large = True

    def handleContentChunk(self, data: bytes) -> None:
        if self.too_large:
            return
        self._received += len(data)
        if self._received > self._cap():
            self.too_large = True
            self._body = io.BytesIO()
            self.content = self._body
            return
        self._body.write(data)


class FacadeSite(server.Site):
    """The Site every facade listener serves; carries the body cap for :class:`FacadeRequest`."""

    requestFactory = FacadeRequest

    def __init__(self, resource: Resource, max_request_body: int) -> None:
        super().__init__(resource)
        self.max_request_body = max_request_body
        self.noisy = False

    def log(self, request: Any) -> None:
        """No access log: paths are fine to log but per-request lines belong at debug level
        (spec §9), and the request path logs its own operational record there."""


def is_loopback(address: object) -> bool:
    """Whether a peer address is loopback, unwrapping IPv4-mapped IPv6 (``::ffff:127.0.0.1``).

    On Python 3.11 ``ip_address("::ffff:127.0.0.1").is_loopback`` is False, and a dual-stack
    listener on ``::`` reports IPv4 peers in exactly that form.
    """
    if not isinstance(address, IPv4Address | IPv6Address):
        # UNIX sockets and in-memory transports are local by construction.
        return True
    return _loopback_host(address.host)


@functools.lru_cache(maxsize=4096)
def _loopback_host(host: str) -> bool:
    # Cached: parsing the same few client addresses on every request showed in profiles.
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def is_preflight(request: Any) -> bool:
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


class BadBody(Exception):
    """The body cannot be admitted: carries the contract's reason (``bad-json``, ...)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def model_from_body(engine: Engine, route: RouteClass, path: str, body: bytes) -> str | None:
    """The model an inference (or model-naming other) body names.

    Inference bodies must be JSON objects (``bad-json`` otherwise); Ollama requires a model
    (``model-missing``), the others serve whatever they have loaded. An "other" body is only
    looked at, never refused: it is forwarded verbatim whatever it holds.
    """
    try:
        document = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        document = None
    if route is not RouteClass.INFERENCE:
        if not isinstance(document, dict):
            return None
        named = document.get("model")
        if not (isinstance(named, str) and named) and path in engine.named_model_paths:
            named = document.get("name")
        return named if isinstance(named, str) and named else None
    if not isinstance(document, dict):
        raise BadBody("bad-json")
    named = document.get("model")
    if isinstance(named, str) and named:
        return named
    if engine.model_required:
        raise BadBody("model-missing")
    return None


class RequestHandler:
    """What a facade hands admitted requests to (the request path)."""

    def handle(self, admitted: Admitted, request: Any) -> Deferred[None]:
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

    def render(self, request: Any) -> object:
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

    def _admit(self, request: Any) -> object:
        engine = self.engine
        if self._peer is not None:
            if not self._still_pinned(request):
                return server.NOT_DONE_YET
        elif not is_loopback(request.getClientAddress()):
            write_error(request, engine, "forbidden")
            return server.NOT_DONE_YET
        if request.too_large:
            # The rest of a refused body is not worth reading: close after answering.
            write_error(request, engine, "body-too-large")
            request.loseConnection()
            return server.NOT_DONE_YET
        path = request.path.decode("latin-1")
        body = request.content.getvalue()
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

    def _still_pinned(self, request: Any) -> bool:
        """Membership and pins are checked per request, not only at the handshake: a
        connection admitted before this node left the cluster (or before the peer's pin was
        removed) carries nothing further. The connection is dropped, which the peer sees as a
        transport failure and fails over from."""
        assert self._peer is not None
        membership = self._peer()
        transport = request.channel.transport if request.channel is not None else None
        certificate = transport.getPeerCertificate() if transport is not None else None
        if (
            membership is not None
            and certificate is not None
            and membership.pinned(certificate) is not None
        ):
            return True
        self.log.info(
            "dropped a peer request: no longer a member or not pinned", engine=self.engine.id
        )
        if transport is not None:
            transport.abortConnection()
        return False

    def _contained(self, failure: Failure, request: Any) -> None:
        """An unexpected failure answers this request 500 and touches nothing else (§3.2)."""
        self.log.failure("handling a request failed", failure, engine=self.engine.id)
        if request.finished or request.channel is None:
            return
        if not request.startedWriting:
            write_error(request, self.engine, "internal")
        else:
            request.loseConnection()


def upstream_headers(request: Any) -> list[tuple[bytes, list[bytes]]]:
    """The client's end-to-end request headers, for the upstream hop."""
    return end_to_end(request.requestHeaders.getAllRawHeaders(), request=True)
