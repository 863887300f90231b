"""Asking every node of an engine at once (inventories, preflights): the I/O half.

Each node is asked concurrently and bounded by ``--dial-timeout`` plus 30 s (contract
"Fleet inventories"). A node that cannot be reached in time is *unavailable* and simply
skipped; one that answered anything at all is a *responder*. Deciding what the answers mean is
left to the pure modules (:mod:`nvpair.inventory`, :mod:`nvpair.cors`).
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import frozen
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from nvpair.upstream import Upstream

#: Added to the dial timeout to bound one node's whole answer.
GRACE = 30.0

#: A model list or preflight answer is small; anything bigger is not one.
MAX_BODY = 16 * 1024 * 1024


@frozen
class Answer:
    """One responder's answer; header names are lower-case."""

    status: int
    headers: dict[bytes, list[bytes]]
    body: bytes


class _Collect(Protocol):
    """Reads a small body whole, refusing one over :data:`MAX_BODY`."""

    def __init__(self) -> None:
        self.done: Deferred[bytes] = Deferred()
        self._parts: list[bytes] = []
        self._size = 0

    def dataReceived(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > MAX_BODY:
            if self.transport is not None:
                self.transport.stopProducing()  # type: ignore[attr-defined]
            return
        self._parts.append(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self._size > MAX_BODY:
            self.done.errback(ValueError("answer too large"))
        elif reason.check(ResponseDone, PotentialDataLoss):
            self.done.callback(b"".join(self._parts))
        else:
            self.done.errback(reason)


async def _ask(
    upstream: Upstream,
    clock: IReactorTime,
    timeout: float,
    base: str | None,
    method: bytes,
    uri: bytes,
    headers: Headers,
) -> Answer | None:
    if base is None:
        return None
    work = Deferred.fromCoroutine(_exchange(upstream, base, method, uri, headers))
    timer = clock.callLater(timeout, work.cancel)
    try:
        return await work
    except Exception:
        # Refused, reset, timed out, too large: unavailable, skipped.
        return None
    finally:
        if timer.active():
            timer.cancel()


async def _exchange(
    upstream: Upstream, base: str, method: bytes, uri: bytes, headers: Headers
) -> Answer:
    response: IResponse = await upstream.request(base, method, uri, headers, None)
    collect = _Collect()
    response.deliverBody(collect)
    body = await collect.done
    raw = {name.lower(): list(values) for name, values in response.headers.getAllRawHeaders()}
    return Answer(response.code, raw, body)


def ask_all(
    upstream: Upstream,
    clock: IReactorTime,
    dial_timeout: float,
    bases: Sequence[str | None],
    method: bytes,
    uri: bytes,
    headers: Headers,
) -> Deferred[list[Answer | None]]:
    """Ask each base URL (None: a node with no address) concurrently; answers in order.

    Cancelling the result cancels every outstanding request.
    """
    timeout = (dial_timeout or 10.0) + GRACE
    asks = [
        Deferred.fromCoroutine(_ask(upstream, clock, timeout, base, method, uri, headers))
        for base in bases
    ]
    return defer.gatherResults(asks, consumeErrors=True)
