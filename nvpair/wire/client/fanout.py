"""Asking every node of an engine at once (inventories, preflights): the I/O half.

Each node is asked concurrently and bounded by ``--dial-timeout`` plus 30 s
(docs/inventories.md#fan-out, "Fleet inventories"). A node that cannot be reached in time is
*unavailable* and simply skipped; one that answered anything at all is a *responder*. Deciding what
the answers mean is left to the pure modules (:mod:`nvpair.engines.inventory`,
:mod:`nvpair.engines.cors`).
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import frozen
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from nvpair.wire.client.bodies import fetch
from nvpair.wire.message import Fields
from nvpair.wire.web import UpstreamClient

#: Added to the dial timeout to bound one node's whole answer.
GRACE = 30.0

#: A model list or preflight answer is small; anything bigger is not one.
MAX_BODY = 16 * 1024 * 1024


@frozen
class NodeReply:
    """One responder's whole answer; header names are lower-case."""

    status: int
    headers: dict[bytes, list[bytes]]
    body: bytes


async def ask(
    upstream: UpstreamClient,
    clock: IReactorTime,
    timeout: float,
    base: str,
    method: bytes,
    uri: bytes,
    fields: Fields,
    max_bytes: int = MAX_BODY,
) -> NodeReply:
    """One node's whole answer, bounded as a whole: dial, headers and body within
    ``timeout`` and ``max_bytes``. Past either bound, or cancelled, the upstream connection is
    closed in whichever phase the exchange is; the failure says why."""
    # A poll or a model list may be asked twice: a stale kept-alive connection is retried.
    sent = upstream.request(base, method, uri, fields, None, resend=True)
    whole = await fetch(sent, clock, timeout, max_bytes)
    head = whole.head
    return NodeReply(head.status, head.fields.lowered(), whole.body)


async def _ask_or_skip(
    upstream: UpstreamClient,
    clock: IReactorTime,
    timeout: float,
    base: str | None,
    method: bytes,
    uri: bytes,
    fields: Fields,
) -> NodeReply | None:
    if base is None:
        return None
    try:
        return await ask(upstream, clock, timeout, base, method, uri, fields)
    except Exception:
        # Refused, reset, timed out, too large: unavailable, skipped.
        return None


def ask_all(
    upstream: UpstreamClient,
    clock: IReactorTime,
    dial_timeout: float,
    bases: Sequence[str | None],
    method: bytes,
    uri: bytes,
    fields: Fields,
) -> Deferred[list[NodeReply | None]]:
    """Ask each base URL (None: a node with no address) concurrently; answers in order.

    Cancelling the result cancels every outstanding request and closes its connection,
    whether it was still dialling, awaiting headers or reading the body.
    """
    timeout = (dial_timeout or 10.0) + GRACE
    asks = [
        Deferred.fromCoroutine(_ask_or_skip(upstream, clock, timeout, base, method, uri, fields))
        for base in bases
    ]
    return defer.gatherResults(asks, consumeErrors=True)
