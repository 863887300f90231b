"""The typed seams between the request path and the wire.

The request path answers a client through :class:`ProxiedRequest`, made of the message types
(:mod:`nvpair.wire.message`): naming exactly what it uses lets mypy check both the real request
(:class:`nvpair.wire.server.request.FacadeRequest`) and the tests' stand-in against the same
interface. The same goes for the upstream client: :class:`nvpair.wire.client.upstream.Upstream`
and a scripted double are both an :class:`UpstreamClient`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from nvpair.wire.message import Answer, Ended, Fields, Flow, RequestHead, ResponseHead


class ProxiedRequest(Protocol):
    """The client's request as the request path uses it: its head as read, and its answer,
    a head then a body sink (docs/architecture.md#the-wire)."""

    #: As read; its target in origin form (what is sent on). Its fields are let go once the
    #: answer has begun.
    head: RequestHead
    #: The target's path.
    path: bytes

    @property
    def started(self) -> bool:
        """The answer's head has gone out."""

    @property
    def finished(self) -> bool:
        """The answer ended complete."""

    @property
    def connected(self) -> bool:
        """The client connection is still there."""

    @property
    def status(self) -> int | None:
        """The answer's status, once :meth:`respond` was called."""

    def respond(self, head: ResponseHead) -> None:
        """The answer's head, written with its first piece or its end."""

    def data(self, chunk: bytes) -> None:
        """One piece of the answer's body (``b""``: the head goes now)."""

    def end(self, ended: Ended) -> None:
        """The answer ended: complete, it is finished; else the connection closes without
        the body's end, so the client sees it was cut."""

    def abort(self) -> None:
        """Drop the connection now (a client that stopped reading)."""

    def on_lost(self, lost: Callable[[Failure], None]) -> None:
        """Calls ``lost`` once, should the client leave before the answer is finished."""

    def follow(self, flow: Flow | None) -> None:
        """Pace ``flow`` by the client (paused while it reads nothing, stopped should it
        leave); None: nothing from now on."""


class UpstreamClient(Protocol):
    """Sends one request to one engine and fires with its response's head."""

    def request(
        self,
        base_url: str,
        method: bytes,
        uri: bytes,
        fields: Fields,
        body: bytes | None,
        connected: Callable[[], None] | None = None,
        resend: bool = False,
    ) -> Deferred[Answer]:
        """Send one request to one engine; fires with its answer once the head has come
        (:meth:`nvpair.wire.client.upstream.Upstream.request`)."""
