"""One engine's facade: admission of a parsed request, which is then handed to the request path.

Admission is everything decided from the request alone that depends on the engine or the
personality: the loopback gate, Ollama's ``Host`` guard, the route class, the model named in
the body. HTTP's own rules and the body cap are the wire's (:mod:`nvpair.wire.facade_server`), which
asks this facade through its :class:`~nvpair.wire.facade_server.Gate`. A request refused here (400,
403) never becomes a workload.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, NamedTuple, Protocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IAddress
from twisted.logger import Logger
from twisted.python.failure import Failure

from nvpair.common.logs import debug_enabled
from nvpair.common.reasons import Reason
from nvpair.engines.admission import (
    BadBody,
    Read,
    is_loopback,
    ollama_host_allowed,
    query_models,
    read_body,
    routing_path,
    target_host,
    wide_escape,
)
from nvpair.engines.caller import Caller
from nvpair.engines.table import Dialect, RouteClass
from nvpair.facades import access
from nvpair.facades.answers import head_refusal, write_error
from nvpair.wire.cluster import Membership
from nvpair.wire.facade_server import FacadeRequest, Refusal, origin_form
from nvpair.wire.message import End, Ended, Fields
from nvpair.wire.web import ProxiedRequest

if TYPE_CHECKING:
    from OpenSSL import SSL

FORBIDDEN = Refusal(Reason.FORBIDDEN)
FORBIDDEN_HOST = Refusal(Reason.FORBIDDEN_HOST)
WIDE_ESCAPE = Refusal(
    Reason.BAD_REQUEST, "a %u escape in the request target is not HTTP, and engines read it apart"
)


def preflight_head(method: bytes, fields: Fields) -> bool:
    """A CORS preflight: ``OPTIONS`` carrying ``Origin`` and ``Access-Control-Request-Method``."""
    return bool(
        method == b"OPTIONS"
        and fields.has(b"Origin")
        and fields.has(b"Access-Control-Request-Method")
    )


class Admitted(NamedTuple):
    """A request that passed admission, ready for the request path (a NamedTuple: one is
    made per request, immutable for a fraction of a frozen attrs class's cost;
    docs/performance.md#per-dispatch-overheads).

    :ivar model: the model as named in the body (None: the body names none).
    :ivar model_key: the engine's comparison key for ``model``.
    :ivar caller: who sent it, where fleet mode's ``[access]`` is in force; None elsewhere
        (docs/lan.md#who-may-call).
    :ivar prefix: an inference body's prefix keys, where fleet mode's affinity wants them
        (docs/fleet-scheduling.md#conversations-go-where-their-cache-is); () elsewhere.
    :ivar member: the body member ``model`` was read from, as the body spells it: where a
        node's own name for the model is written (docs/model-names.md).
    :ivar others: every other model the request names (body members, a ``model`` query
        parameter), judged against a key as ``model`` is (docs/lan.md#what-a-key-can-and-cannot-do).
    """

    engine: Dialect
    route: RouteClass
    method: bytes
    path: str
    uri: bytes
    body: bytes
    model: str | None
    model_key: str | None
    caller: Caller | None = None
    prefix: tuple[int, ...] = ()
    member: str = "model"
    others: tuple[str, ...] = ()
    #: The body is there but no JSON object the proxy reads: what model it names, if any,
    #: cannot be judged (docs/lan.md#what-a-key-can-and-cannot-do).
    opaque: bool = False
    #: The caller's source address (None off a socket): who a keyless caller is to the fleet's
    #: queue (docs/fleet-scheduling.md#the-queue).
    client: str | None = None
    #: The pattern alias that took a model no name matched; ``model_key`` is then its key on
    #: every engine (:mod:`nvpair.control.naming`, docs/model-names.md#pattern-aliases).
    pattern: str | None = None


class CallerGate(Protocol):
    """What a facade asks of fleet mode's ``[access]`` (:class:`nvpair.fleet.langate.LanGate`)."""

    def refusal(
        self, peer: IAddress | None, fields: Fields, preflight: bool = False, tls: bool = False
    ) -> Refusal | None:
        """A caller's refusal at its request head, or None to read on (a loopback caller's
        only under ``loopback-keys``); ``tls``: the connection is TLS."""

    def caller(
        self, peer: IAddress | None, fields: Fields, preflight: bool = False
    ) -> Caller | Refusal | None:
        """Who an admitted request came from (None: no ``[access]``), or its refusal."""

    @property
    def tls(self) -> SSL.Context | None:
        """The TLS context LAN callers get now (None: no TLS for them)."""


class RequestHandler:
    """What a facade hands admitted requests to (the request path)."""

    def handle(self, admitted: Admitted, request: ProxiedRequest) -> Deferred[None]:
        raise NotImplementedError


class Facade:
    """What one engine's listener serves: the :class:`~nvpair.wire.facade_server.Gate` its
    connections (:mod:`nvpair.wire.facade_server`) ask.

    :param engine: the engine whose dialect this facade speaks.
    :param handler: the request path.
    :param access_log: where a request refused before the request path is written down (the
        request path writes the rest); None when the access log is off.
    :param lan: fleet mode's ``[access]``: which non-loopback callers are served, with which
        keys (None: none, as in broker mode).
    :param prefix_of: fleet mode's affinity: an inference body's prefix keys, from the body as
        admission parsed it (docs/fleet-scheduling.md#conversations-go-where-their-cache-is);
        None: none are wanted (broker mode).
    :param refusals: where a refusal before the request path is counted (None: nowhere,
        without an admin listener).
    :param tls: this facade serves LAN callers' TLS connections, where the plaintext one
        serves the rest: ``[access]`` may refuse a LAN caller over plaintext (docs/lan.md#tls).
    """

    log = Logger()

    def __init__(
        self,
        engine: Dialect,
        handler: RequestHandler,
        *,
        peer: Callable[[], Membership | None] | None = None,
        access_log: access.AccessLog | None = None,
        lan: CallerGate | None = None,
        prefix_of: Callable[[object], tuple[int, ...]] | None = None,
        refusals: access.RefusalCounter | None = None,
        tls: bool = False,
    ) -> None:
        """:param peer: serve the cluster personality with this live membership: every request
        is a pinned peer's and goes to the local engine as it is."""
        self.engine = engine
        self._handler = handler
        self._peer = peer
        self._access = access_log
        self._lan = lan
        self._prefix_of = prefix_of
        self._tls = tls
        self._refusals = refusals

    def serve(self, request: FacadeRequest) -> None:
        """Admit a whole request (head and body) and hand it to the request path."""
        try:
            self._admit(request)
        except Exception:
            self.log.failure("admitting a request failed", engine=self.engine.id)
            if not request.started:
                head = request.head
                path = routing_path(request.path)
                route = self._route(head.method, path, head.fields)
                self._refused(head.method, path, Reason.INTERNAL, route, _host(request))
                write_error(request, self.engine, Reason.INTERNAL)

    def refusal_at_head(
        self, peer: IAddress | None, target: bytes, fields: Fields, method: bytes
    ) -> Refusal | None:
        """The loopback gate and ``[access]`` (not for a pinned peer), then Ollama's ``Host``
        guard, for loopback callers only: a LAN caller names this machine as it names any."""
        if self._peer is not None:
            return None
        if wide_escape(target):
            return WIDE_ESCAPE
        if self._lan is not None:
            # A loopback caller too: [access] loopback-keys may ask it for a key (docs/lan.md).
            refused = self._lan.refusal(peer, fields, preflight_head(method, fields), self._tls)
            if refused is not None or not is_loopback(peer):
                return refused
        elif not is_loopback(peer):
            return FORBIDDEN
        if self.engine.host_guard and not ollama_host_allowed(
            target_host(target, fields.first(b"Host"))
        ):
            return FORBIDDEN_HOST
        return None

    def refusal_answer(
        self,
        refusal: Refusal,
        target: bytes,
        method: bytes,
        fields: Fields | None = None,
        peer: IAddress | None = None,
    ) -> bytes:
        """The refusal in this engine's dialect; counted, and with the access log on, its
        line too."""
        form = origin_form(target)
        path = (form or b"/").split(b"?", 1)[0].decode("latin-1")
        # No method: no request line was read, and the target is a stand-in.
        read = form is not None and bool(method)
        route = self._route(method, routing_path(path.encode("latin-1")), fields) if read else None
        host = getattr(peer, "host", None)
        self._refused(method, path if read else None, refusal.reason, route, host, logged=False)
        return head_refusal(
            self.engine,
            path,
            refusal.reason,
            refusal.message,
            head_only=method == b"HEAD",
            extra=refusal.headers,
        )

    def _route(self, method: bytes, path: str, fields: Fields | None) -> RouteClass:
        """The route class a request would have had, as admission classifies it."""
        if self._peer is not None:
            return RouteClass.PEER
        if fields is not None and preflight_head(method, fields):
            return RouteClass.PREFLIGHT
        return self.engine.classify(method, path)

    def _refused(
        self,
        method: bytes,
        path: str | None,
        reason: Reason,
        route: RouteClass | None,
        client: str | None,
        logged: bool = True,
    ) -> None:
        """A request refused before the request path: counted under its reason, routed as it
        would have been (``other`` for bytes that were no request; docs/operations.md#metrics),
        and written to the access log.

        :param logged: whether the access line names the route (a head refusal's does not:
            it was refused before it was classified)."""
        engine = self.engine.id
        if self._refusals is not None:
            counted = RouteClass.OTHER if route is None else route
            self._refusals.request_refused(engine, counted.value, reason.value)
        if self._access is not None:
            self._access.write(
                access.refused(engine, method, path, reason, route if logged else None, client)
            )

    def _admit(self, request: FacadeRequest) -> None:
        engine = self.engine
        head = request.head
        method = head.method
        if self._peer is not None and not self._still_pinned(request):
            return
        # Routed as the engines route it: percent-decoded (docs/request-path.md#admission).
        path = routing_path(request.path)
        caller = None
        prefix: tuple[int, ...] = ()
        member, opaque = "model", False
        others: tuple[str, ...] = ()
        if self._peer is not None:
            route, model = RouteClass.PEER, None
        else:
            preflight = preflight_head(method, head.fields)
            if self._lan is not None:
                found = self._lan.caller(_client(request), head.fields, preflight)
                if isinstance(found, Refusal):
                    # [access] was reloaded since the head: it lets this caller in no more.
                    route = self._route(method, path, head.fields)
                    self._refused(method, path, found.reason, route, _host(request))
                    write_error(
                        request, engine, found.reason, message=found.message, extra=found.headers
                    )
                    return
                caller = found
            route = RouteClass.PREFLIGHT if preflight else engine.classify(method, path)
            try:
                read, prefix = request.read_json(partial(self._read_body, route, path))
            except BadBody as refused:
                self._refused(method, path, refused.reason, route, _host(request))
                write_error(request, engine, refused.reason)
                return
            model, member, others, opaque = read.model, read.member, read.others, read.opaque
            if caller is not None:
                if b"?" in head.target:
                    # A llama.cpp router loads the model a query names (/props?model=...).
                    others = (*others, *query_models(head.target))
                named = engine.path_model(path)
                if named is not None:
                    others = (*others, named)
        # After the body was read: a large one was held as its text meanwhile.
        body = request.body()
        admitted = Admitted(
            engine=engine,
            route=route,
            method=method,
            path=path,
            uri=head.target,
            body=body,
            model=model,
            model_key=None if model is None else engine.model_key(model),
            caller=caller,
            prefix=prefix,
            member=member,
            others=others,
            opaque=opaque,
            client=_host(request),
        )
        if debug_enabled():
            self.log.debug(
                "{method} {path} route={route} model={model}",
                engine=engine.id,
                method=method.decode("latin-1"),
                path=path,
                route=route.value,
                model=model,
            )
        d = self._handler.handle(admitted, request)
        d.addErrback(self._contained, request)

    def _read_body(
        self, route: RouteClass, path: str, body: bytes | str
    ) -> tuple[Read, tuple[int, ...]]:
        """What admission reads of the body and, where affinity wants them, its prefix keys:
        all it keeps of the document, which goes once they are read
        (docs/robustness.md#what-a-request-body-costs)."""
        read = read_body(self.engine, route, path, body)
        prefix: tuple[int, ...] = ()
        if self._prefix_of is not None and route is RouteClass.INFERENCE:
            prefix = self._prefix_of(read.document)
        return read._replace(document=None), prefix

    def _still_pinned(self, request: FacadeRequest) -> bool:
        """Membership and pins are checked per request, not only at the handshake: a
        connection admitted before this node left the cluster (or before the peer's pin was
        removed) carries nothing further. The connection is dropped, which the peer sees as a
        transport failure and fails over from."""
        assert self._peer is not None
        membership = self._peer()
        transport = request.channel.transport if request.channel is not None else None
        # TLSMemoryBIOProtocol has getPeerCertificate (an X509 once the handshake is done) but
        # declares no ISSLTransport.
        peer_certificate = getattr(transport, "getPeerCertificate", None)
        certificate = peer_certificate() if peer_certificate is not None else None
        if (
            membership is not None
            and certificate is not None
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
        if not request.started:
            write_error(request, self.engine, Reason.INTERNAL)
        else:
            request.end(Ended(End.BROKEN, failure.value))


def _client(request: FacadeRequest) -> IAddress | None:
    """The address the request came from (over TLS, the TLS transport's underlying one)."""
    channel = request.channel
    return channel.peer if channel is not None and channel.transport is not None else None


def _host(request: FacadeRequest) -> str | None:
    """The source address of the request, as text."""
    host = getattr(_client(request), "host", None)
    return host if isinstance(host, str) else None
