"""One engine's facade for pinned cluster peers: what a facade port's mutual-TLS side serves
(docs/cluster.md).

A peer's request was routed already, by the node that sent it: it goes to the local engine as
it is, as ``peer``, never re-routed. The handshake pinned the peer, so no loopback gate, Host
guard or model is read here; what is checked again, per request, is that the peer is still
pinned by a node still in the cluster.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IAddress
from twisted.logger import Logger

from nvpair.engines.admission import routing_path
from nvpair.engines.table import Dialect, RouteClass
from nvpair.facades import access
from nvpair.facades.desk import FrontDesk, client_host
from nvpair.facades.facade import Admitted, RequestHandler
from nvpair.wire.message import Fields
from nvpair.wire.server.site import FacadeRequest, Refusal
from nvpair.wire.trust.cluster import Membership


def _as_peer(method: bytes, path: str, fields: Fields | None) -> RouteClass:
    return RouteClass.PEER


class PeerFacade:
    """What one engine's listener serves pinned peers over mutual TLS: the
    :class:`~nvpair.wire.server.site.Gate` their connections ask.

    :param engine: the engine whose dialect this facade speaks (its local backend serves).
    :param handler: the request path.
    :param membership: the live cluster membership, which pins the peers (None: this node is
        in no cluster now, and no peer is served).
    :param access_log: where a request refused before the request path is written down.
    :param refusals: where a refusal before the request path is counted.
    """

    log = Logger()

    def __init__(
        self,
        engine: Dialect,
        handler: RequestHandler,
        membership: Callable[[], Membership | None],
        *,
        access_log: access.AccessLog = access.NO_ACCESS_LOG,
        refusals: access.RefusalCounter = access.NO_REFUSALS,
    ) -> None:
        self.engine = engine
        self._handler = handler
        self._membership = membership
        self._desk = FrontDesk(engine, _as_peer, access_log=access_log, refusals=refusals)
        #: The refusal in this engine's dialect, counted and written down as a peer request's.
        self.refusal_answer = self._desk.refusal_answer

    def serve(self, request: FacadeRequest) -> None:
        """Hand a pinned peer's whole request to the request path, as it is."""
        self._desk.serve(self._admit, request)

    def refusal_at_head(
        self, peer: IAddress | None, target: bytes, fields: Fields, method: bytes
    ) -> Refusal | None:
        """None: the handshake pinned the peer, and the node that sent the request judged it
        as the caller's own facade did."""
        return None

    def _admit(self, request: FacadeRequest) -> None:
        if not self._still_pinned(request):
            return
        # Routed as the engines route it: percent-decoded (docs/request-path.md#admission).
        path = routing_path(request.path)
        admitted = Admitted(
            engine=self.engine,
            route=RouteClass.PEER,
            method=request.head.method,
            path=path,
            uri=request.head.target,
            body=request.body(),
            model=None,
            model_key=None,
            client=client_host(request),
        )
        self._desk.admitted(request.head.method, path, RouteClass.PEER, None)
        self._handler.handle(admitted, request).addErrback(self._desk.contained, request)

    def _still_pinned(self, request: FacadeRequest) -> bool:
        """Membership and pins are checked per request, not only at the handshake: a
        connection admitted before this node left the cluster (or before the peer's pin was
        removed) carries nothing further. The connection is dropped, which the peer sees as a
        transport failure and fails over from."""
        membership = self._membership()
        certificate = request.peer_certificate()
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
