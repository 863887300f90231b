"""The admin routes behind the gate a LAN caller passes (docs/lan.md#the-admin-view-from-the-lan).

:class:`Guarded` asks, per request, whether to serve it; a refusal is answered here, in the
same shape as the proxy's other answers (``X-Nvpair-Error`` and a small JSON body), and the
routes never see the request. :func:`lan_factory` is what the listener's LAN address accepts
with: plaintext or TLS by the first byte, as on a facade's port, under the same connection
bounds.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from twisted.internet.interfaces import IAddress, IReactorTime
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource

from nvpair.facades.answers import reason_phrase
from nvpair.fleet.langate import LanGate
from nvpair.observe.admin import QuietSite
from nvpair.wire.message import Fields
from nvpair.wire.server.head import Refusal
from nvpair.wire.trust.connbounds import ConnectionCounts
from nvpair.wire.trust.sniffing import SniffingFactory

#: Whether to serve a request: (peer, method, path, its head's fields, over TLS) -> its refusal
#: or None.
Judge = Callable[[IAddress | None, bytes, bytes, Fields, bool], Refusal | None]


class Guarded(Resource):
    """``inner`` (the admin routes) for the requests ``judge`` lets through.

    A leaf, as klein's own resource is: the whole path reaches ``inner`` unchanged.

    :param tls: the requests of this site came over TLS.
    """

    isLeaf = True

    def __init__(self, inner: IResource, judge: Judge, tls: bool = False) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._inner = inner
        self._judge = judge
        self._tls = tls

    def render(self, request: IRequest) -> bytes | int:
        refusal = self._judge(
            request.getClientAddress(),
            request.method,
            request.path,
            # twisted.web's head, as the gate reads every head.
            Fields.of(request.requestHeaders.getAllRawHeaders()),
            self._tls,
        )
        if refusal is None:
            return self._inner.render(request)  # type: ignore[no-any-return]
        return refused(request, refusal)


def refused(request: IRequest, refusal: Refusal) -> bytes:
    """The answer to a refused request: its status, reason and headers; never its content."""
    reason = refusal.reason
    request.setResponseCode(reason.status, reason_phrase(reason.status))
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"x-nvpair-error", reason.value.encode("ascii"))
    request.setHeader(b"cache-control", b"no-store")
    for name, value in refusal.headers:
        request.setHeader(name, value)
    body = {"error": reason.value, "message": refusal.message or reason.message}
    return json.dumps(body).encode()


def lan_factory(
    clock: IReactorTime,
    routes: IResource,
    gate: LanGate,
    bounds: ConnectionCounts | None,
    where: tuple[str, int],
) -> SniffingFactory:
    """What the LAN address ``where`` accepts with: plaintext, or TLS while ``[access]`` serves
    it (the facades' certificate, read live from ``gate``), each request judged by ``gate``. No
    cluster peer is served here: with no membership, no client certificate is asked for."""
    host, port = where
    plain = QuietSite(Guarded(routes, gate.admin_refusal), host, port)
    over_tls = QuietSite(Guarded(routes, gate.admin_refusal, tls=True), host, port)
    return SniffingFactory(
        clock, plain, over_tls, lambda: None, lan=over_tls, lan_tls=lambda: gate.tls, bounds=bounds
    )
