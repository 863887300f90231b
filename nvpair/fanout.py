"""Asking every node of an engine at once (inventories, preflights): the I/O half.

Each node is asked concurrently and bounded by ``--dial-timeout`` plus 30 s (contract
"Fleet inventories"). A node that cannot be reached in time is *unavailable* and simply
skipped; one that answered anything at all is a *responder*. Deciding what the answers mean is
left to the pure modules (:mod:`nvpair.inventory`, :mod:`nvpair.cors`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from attrs import frozen
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from nvpair.bodies import fetch

#: Added to the dial timeout to bound one node's whole answer.
GRACE = 30.0

#: A model list or preflight answer is small; anything bigger is not one.
MAX_BODY = 16 * 1024 * 1024


class Requester(Protocol):
    """What a fan-out sends through: :class:`nvpair.upstream.Upstream`'s ``request``."""

    def request(
        self, base_url: str, method: bytes, uri: bytes, headers: Headers, body: bytes | None
    ) -> Deferred[IResponse]: ...


@frozen
class Answer:
    """One responder's answer; header names are lower-case."""

    status: int
    headers: dict[bytes, list[bytes]]
    body: bytes


async def _ask(
    upstream: Requester,
    clock: IReactorTime,
    timeout: float,
    base: str | None,
    method: bytes,
    uri: bytes,
    headers: Headers,
) -> Answer | None:
    if base is None:
        return None
    try:
        sent = upstream.request(base, method, uri, headers, None)
        # One bound over dial, headers and body; its expiry, like cancelling this ask, closes
        # the upstream connection in whichever phase the exchange is.
        whole = await fetch(sent, clock, timeout, MAX_BODY)
    except Exception:
        # Refused, reset, timed out, too large: unavailable, skipped.
        return None
    response = whole.response
    raw = {name.lower(): list(values) for name, values in response.headers.getAllRawHeaders()}
    return Answer(response.code, raw, whole.body)


def ask_all(
    upstream: Requester,
    clock: IReactorTime,
    dial_timeout: float,
    bases: Sequence[str | None],
    method: bytes,
    uri: bytes,
    headers: Headers,
) -> Deferred[list[Answer | None]]:
    """Ask each base URL (None: a node with no address) concurrently; answers in order.

    Cancelling the result cancels every outstanding request and closes its connection,
    whether it was still dialling, awaiting headers or reading the body.
    """
    timeout = (dial_timeout or 10.0) + GRACE
    asks = [
        Deferred.fromCoroutine(_ask(upstream, clock, timeout, base, method, uri, headers))
        for base in bases
    ]
    return defer.gatherResults(asks, consumeErrors=True)
