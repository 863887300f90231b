"""What both facade personalities share (:mod:`nvpair.facades.facade` for loopback and LAN
callers, :mod:`nvpair.facades.peer` for pinned cluster peers): a request refused before the
request path is counted, written to the access log and answered in the engine's dialect, and an
unexpected failure stays its own request's.

Each personality keeps its own admission and says how it would have routed a request; the rest
is here once, so the two cannot drift apart in what they count or write down.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IAddress
from twisted.logger import Logger
from twisted.python.failure import Failure

from nvpair.common.logs import debug_enabled
from nvpair.common.reasons import Reason
from nvpair.engines.admission import routing_path
from nvpair.engines.table import Dialect, RouteClass
from nvpair.facades import access
from nvpair.facades.answers import head_refusal, write_error
from nvpair.wire.message import End, Ended, Fields
from nvpair.wire.server.site import FacadeRequest, Refusal, origin_form

#: How a personality would route a request from its method, routing path and headers (None:
#: no head was read).
Route = Callable[[bytes, str, Fields | None], RouteClass]


class FrontDesk:
    """One facade's refusals and failures, as both personalities handle them.

    :param engine: the facade's engine.
    :param route: how the facade's personality routes a request.
    :param access_log: where a request refused before the request path is written down (the
        request path writes the rest).
    :param refusals: where a refusal before the request path is counted.
    """

    log = Logger()

    def __init__(
        self,
        engine: Dialect,
        route: Route,
        *,
        access_log: access.AccessLog = access.NO_ACCESS_LOG,
        refusals: access.RefusalCounter = access.NO_REFUSALS,
    ) -> None:
        self.engine = engine
        self._route = route
        self._access = access_log
        self._refusals = refusals

    def serve(self, admit: Callable[[FacadeRequest], None], request: FacadeRequest) -> None:
        """Admit a whole request with ``admit``; one that fails there is answered 500."""
        try:
            admit(request)
        except Exception:
            self.log.failure("admitting a request failed", engine=self.engine.id)
            if not request.started:
                path = routing_path(request.path)
                head = request.head
                route = self._route(head.method, path, head.fields)
                self.refused(head.method, path, Reason.INTERNAL, route, client_host(request))
                write_error(request, self.engine, Reason.INTERNAL)

    def refusal_answer(
        self,
        refusal: Refusal,
        target: bytes,
        method: bytes,
        fields: Fields | None = None,
        peer: IAddress | None = None,
    ) -> bytes:
        """The refusal in this engine's dialect; counted, and written to the access log."""
        form = origin_form(target)
        path = (form or b"/").split(b"?", 1)[0].decode("latin-1")
        # No method: no request line was read, and the target is a stand-in.
        read = form is not None and bool(method)
        route = self._route(method, routing_path(path.encode("latin-1")), fields) if read else None
        host = getattr(peer, "host", None)
        self.refused(method, path if read else None, refusal.reason, route, host, logged=False)
        return head_refusal(
            self.engine,
            path,
            refusal.reason,
            refusal.message,
            head_only=method == b"HEAD",
            extra=refusal.headers,
        )

    def refused(
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
        counted = RouteClass.OTHER if route is None else route
        self._refusals.request_refused(engine, counted.value, reason.value)
        self._access.write(
            access.refused(engine, method, path, reason, route if logged else None, client)
        )

    def admitted(self, method: bytes, path: str, route: RouteClass, model: str | None) -> None:
        """Per-request detail, below info (docs/README.md#logging)."""
        if debug_enabled():
            self.log.debug(
                "{method} {path} route={route} model={model}",
                engine=self.engine.id,
                method=method.decode("latin-1"),
                path=path,
                route=route.value,
                model=model,
            )

    def contained(self, failure: Failure, request: FacadeRequest) -> None:
        """An unexpected failure answers this request 500 and touches nothing else
        (docs/request-path.md#admission)."""
        self.log.failure("handling a request failed", failure, engine=self.engine.id)
        if request.finished or not request.connected:
            return
        if not request.started:
            write_error(request, self.engine, Reason.INTERNAL)
        else:
            request.end(Ended(End.BROKEN, failure.value))


def client_address(request: FacadeRequest) -> IAddress | None:
    """The address the request came from (over TLS, the TLS transport's underlying one)."""
    return request.peer


def client_host(request: FacadeRequest) -> str | None:
    """The source address of the request, as text."""
    host = getattr(client_address(request), "host", None)
    return host if isinstance(host, str) else None
