"""The typed seams between the request path and Twisted's web machinery.

twisted.web's ``Request`` is largely untyped; the request path needs a handful of its members,
and naming exactly those here lets mypy check both the real request
(:class:`nvpair.facades.facade.FacadeRequest`) and the tests' stand-in against the same interface.
The same goes for the upstream client: :class:`nvpair.wire.upstream.Upstream` and a scripted
double are both an :class:`UpstreamClient`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from nvpair.wire.message import Answer, Fields


class ProxiedRequest(Protocol):
    """The client's request as the request path uses it: read the head, answer, stream."""

    method: bytes
    path: bytes
    uri: bytes
    requestHeaders: Headers
    responseHeaders: Headers

    @property
    def code(self) -> int | None:
        """The answer's status, once set."""

    @property
    def finished(self) -> bool | int:
        """The answer has been finished."""

    @property
    def startedWriting(self) -> bool | int:
        """The status line and headers have gone out."""

    @property
    def connected(self) -> bool:
        """The client connection is still there."""

    def setResponseCode(self, code: int, message: bytes | None = None) -> None: ...

    def write(self, data: bytes) -> None: ...

    def finish(self) -> None: ...

    def loseConnection(self) -> None:
        """Close after what was written has gone out."""

    def abort(self) -> None:
        """Drop the connection now (a client that stopped reading)."""

    def notifyFinish(self) -> Deferred[None]:
        """Fires when the answer is done; fails when the client left first."""

    def on_lost(self, lost: Callable[[Failure], None]) -> None:
        """Calls ``lost`` once, should the client leave before the answer is finished."""

    def registerProducer(self, producer: IPushProducer, streaming: bool) -> None: ...

    def unregisterProducer(self) -> None: ...


class UpstreamClient(Protocol):
    """Sends one request to one engine and fires with its answer once the head has come."""

    def request(
        self,
        base_url: str,
        method: bytes,
        uri: bytes,
        headers: Fields | Headers,
        body: bytes | None,
        connected: Callable[[], None] | None = None,
        resend: bool = False,
    ) -> Deferred[Answer]:
        """See :meth:`nvpair.wire.upstream.Upstream.request`."""
