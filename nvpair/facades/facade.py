"""One engine's facade for loopback and LAN callers: admission of a parsed request, which is
then handed to the request path. Pinned cluster peers have a facade of their own
(:mod:`nvpair.facades.peer`).

Admission is everything decided from the request alone that depends on the engine or the
caller: the loopback gate or fleet mode's ``[access]``, Ollama's ``Host`` guard, the route
class, the model named in the body. HTTP's own rules and the body cap are the wire's
(:mod:`nvpair.wire.server.site`), which asks this facade through its
:class:`~nvpair.wire.server.site.Gate`. A request refused here (400, 403) never becomes a
workload.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, NamedTuple, Protocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IAddress

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
from nvpair.facades.answers import write_error
from nvpair.facades.desk import FrontDesk, client_address, client_host
from nvpair.wire.message import Fields
from nvpair.wire.server.site import FacadeRequest, Refusal
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


class _LoopbackOnly:
    """No ``[access]`` (broker mode, or a fleet without one): loopback callers only, no keys,
    no TLS for anyone else."""

    def refusal(
        self, peer: IAddress | None, fields: Fields, preflight: bool = False, tls: bool = False
    ) -> Refusal | None:
        return None if is_loopback(peer) else FORBIDDEN

    def caller(
        self, peer: IAddress | None, fields: Fields, preflight: bool = False
    ) -> Caller | Refusal | None:
        return None

    @property
    def tls(self) -> SSL.Context | None:
        return None


#: The caller gate of a facade without fleet mode's ``[access]``.
LOOPBACK_ONLY: CallerGate = _LoopbackOnly()


def no_prefix(document: object) -> tuple[int, ...]:
    """No affinity (broker mode): no prefix keys are wanted of a body."""
    return ()


class RequestHandler:
    """What a facade hands admitted requests to (the request path)."""

    def handle(self, admitted: Admitted, request: ProxiedRequest) -> Deferred[None]:
        raise NotImplementedError


class Facade:
    """What one engine's listener serves loopback callers and, under fleet mode's ``[access]``,
    LAN callers: the :class:`~nvpair.wire.server.site.Gate` its connections
    (:mod:`nvpair.wire.server.site`) ask. Pinned cluster peers have their own
    (:class:`nvpair.facades.peer.PeerFacade`).

    :param engine: the engine whose dialect this facade speaks.
    :param handler: the request path.
    :param access_log: where a request refused before the request path is written down (the
        request path writes the rest).
    :param lan: fleet mode's ``[access]``: which non-loopback callers are served, with which
        keys (:data:`LOOPBACK_ONLY`: none, as in broker mode).
    :param prefix_of: fleet mode's affinity: an inference body's prefix keys, from the body as
        admission parsed it (docs/fleet-scheduling.md#conversations-go-where-their-cache-is);
        :func:`no_prefix` in broker mode.
    :param refusals: where a refusal before the request path is counted.
    :param tls: this facade serves LAN callers' TLS connections, where the plaintext one
        serves the rest: ``[access]`` may refuse a LAN caller over plaintext (docs/lan.md#tls).
    """

    def __init__(
        self,
        engine: Dialect,
        handler: RequestHandler,
        *,
        access_log: access.AccessLog = access.NO_ACCESS_LOG,
        lan: CallerGate = LOOPBACK_ONLY,
        prefix_of: Callable[[object], tuple[int, ...]] = no_prefix,
        refusals: access.RefusalCounter = access.NO_REFUSALS,
        tls: bool = False,
    ) -> None:
        self.engine = engine
        self._handler = handler
        self._lan = lan
        self._prefix_of = prefix_of
        self._tls = tls
        self._desk = FrontDesk(engine, self._route, access_log=access_log, refusals=refusals)
        #: The refusal in this engine's dialect, counted and written down as routed here.
        self.refusal_answer = self._desk.refusal_answer

    def serve(self, request: FacadeRequest) -> None:
        """Admit a whole request (head and body) and hand it to the request path."""
        self._desk.serve(self._admit, request)

    def refusal_at_head(
        self, peer: IAddress | None, target: bytes, fields: Fields, method: bytes
    ) -> Refusal | None:
        """The loopback gate or ``[access]``, then Ollama's ``Host`` guard, for loopback
        callers only: a LAN caller names this machine as it names any."""
        if wide_escape(target):
            return WIDE_ESCAPE
        # A loopback caller too: [access] loopback-keys may ask it for a key (docs/lan.md).
        refused = self._lan.refusal(peer, fields, preflight_head(method, fields), self._tls)
        if refused is not None or not is_loopback(peer):
            return refused
        if self.engine.host_guard and not ollama_host_allowed(
            target_host(target, fields.first(b"Host"))
        ):
            return FORBIDDEN_HOST
        return None

    def _route(self, method: bytes, path: str, fields: Fields | None) -> RouteClass:
        """The route class a request would have had, as admission classifies it."""
        if fields is not None and preflight_head(method, fields):
            return RouteClass.PREFLIGHT
        return self.engine.classify(method, path)

    def _admit(self, request: FacadeRequest) -> None:
        engine = self.engine
        # Routed as the engines route it: percent-decoded (docs/request-path.md#admission).
        path = routing_path(request.path)
        head = request.head
        method = head.method
        preflight = preflight_head(method, head.fields)
        found = self._lan.caller(client_address(request), head.fields, preflight)
        if isinstance(found, Refusal):
            # [access] was reloaded since the head: it lets this caller in no more.
            route = self._route(method, path, head.fields)
            self._desk.refused(method, path, found.reason, route, client_host(request))
            write_error(request, engine, found.reason, message=found.message, extra=found.headers)
            return
        caller = found
        route = RouteClass.PREFLIGHT if preflight else engine.classify(method, path)
        try:
            read, prefix = request.read_json(partial(self._read_body, route, path))
        except BadBody as refused:
            self._desk.refused(method, path, refused.reason, route, client_host(request))
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
            client=client_host(request),
        )
        self._desk.admitted(method, path, route, model)
        self._handler.handle(admitted, request).addErrback(self._desk.contained, request)

    def _read_body(
        self, route: RouteClass, path: str, body: bytes | str
    ) -> tuple[Read, tuple[int, ...]]:
        """What admission reads of the body and, where affinity wants them, its prefix keys:
        all it keeps of the document, which goes once they are read
        (docs/robustness.md#what-a-request-body-costs)."""
        read = read_body(self.engine, route, path, body)
        prefix: tuple[int, ...] = ()
        if route is RouteClass.INFERENCE:
            prefix = self._prefix_of(read.document)
        return read._replace(document=None), prefix
