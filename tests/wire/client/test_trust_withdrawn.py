"""Trust withdrawn means connections closed (docs/cluster.md#trust-withdrawn), over real TLS.

A peer's engine answers over pinned mutual TLS on loopback; the proxy's Upstream keeps the
connection alive in its pool. When the peer's pin goes, the pooled connection must close and
no later request may travel on it. And a large body, fed to TLS's own buffer as it drains,
arrives whole.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest_twisted
from OpenSSL import SSL
from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IOpenSSLContextFactory
from twisted.internet.task import deferLater
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.web.resource import Resource
from twisted.web.server import Site
from zope.interface import implementer

from nvpair.wire.client.bodies import read_body
from nvpair.wire.message import Answer, Fields
from nvpair.wire.trust.cluster import Membership, load_membership
from nvpair.wire.trust.tls import PinnedPeers, server_context
from tests.certs import make_identity, write_cluster_dir

#: The global reactor, untyped: its listen*/connect* generics reject a Site.
reactor: Any = _reactor


class Hello(Resource):
    isLeaf = True

    def render(self, request: Any) -> bytes:
        return b"hello"


class Tracked(WrappingFactory):
    """Counts the server side's open connections."""

    def __init__(self, wrapped: Any) -> None:
        super().__init__(wrapped)
        self.opened = 0
        self.closed = 0

    def registerProtocol(self, p: ProtocolWrapper) -> None:
        self.opened += 1
        super().registerProtocol(p)

    def unregisterProtocol(self, p: ProtocolWrapper) -> None:
        self.closed += 1
        super().unregisterProtocol(p)


@implementer(IOpenSSLContextFactory)
class Context:
    def __init__(self, context: SSL.Context) -> None:
        self._context = context

    def getContext(self) -> SSL.Context:
        return self._context


async def read(answer: Answer) -> bytes:
    """The whole body of ``answer`` (no time bound; a test's bodies are small)."""
    return await read_body(answer, reactor, None, 16 * 1024 * 1024)


async def until(predicate: Any, seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if predicate():
            return
        await deferLater(reactor, 0.02, lambda: None)
    raise AssertionError("condition not reached")


def membership(directory: Path, me: Any, peers: list[Any]) -> Membership:
    loaded = load_membership(write_cluster_dir(directory, me, peers))
    assert loaded is not None
    return loaded


@pytest_twisted.ensureDeferred
async def test_removing_a_pin_closes_the_pooled_connection_to_that_peer(tmp_path: Path) -> None:
    from nvpair.wire.client.upstream import Upstream

    me, peer = make_identity("me"), make_identity("peer")
    peer_side = membership(tmp_path / "peer", peer, [me])
    server = Tracked(Site(Hello()))
    port = reactor.listenSSL(0, server, Context(server_context(peer_side)), interface="127.0.0.1")
    current: list[Membership | None] = [membership(tmp_path / "me", me, [peer])]
    url = f"https://127.0.0.1:{port.getHost().port}"
    upstream = Upstream(reactor, 5.0, PinnedPeers(lambda: current[0], lambda host, p: "peer"))
    try:
        answer = await upstream.request(url, b"GET", b"/", Fields(), None)
        assert await read(answer) == b"hello"
        await until(lambda: server.opened == 1)
        # Kept alive: a second request reuses the pooled connection.
        answer = await upstream.request(url, b"GET", b"/", Fields(), None)
        assert await read(answer) == b"hello" and server.opened == 1

        # The peer's pin is removed from this node's cluster directory.
        (tmp_path / "me" / "pins" / "peer.pin").unlink()
        current[0] = load_membership(tmp_path / "me")
        upstream.trust_changed()
        await until(lambda: server.closed == 1)

        failed: Deferred[Any] = upstream.request(url, b"GET", b"/", Fields(), None)
        try:
            await failed
        except Exception:
            pass
        else:
            raise AssertionError("a request travelled to a peer whose pin was withdrawn")
    finally:
        await upstream.close()
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_connection_busy_when_trust_changes_is_not_reused(tmp_path: Path) -> None:
    from nvpair.wire.client.upstream import Upstream

    me, peer = make_identity("me"), make_identity("peer")
    peer_side = membership(tmp_path / "peer", peer, [me])
    server = Tracked(Site(Hello()))
    port = reactor.listenSSL(0, server, Context(server_context(peer_side)), interface="127.0.0.1")
    current: list[Membership | None] = [membership(tmp_path / "me", me, [peer])]
    url = f"https://127.0.0.1:{port.getHost().port}"
    upstream = Upstream(reactor, 5.0, PinnedPeers(lambda: current[0], lambda host, p: "peer"))
    try:
        answer = await upstream.request(url, b"GET", b"/", Fields(), None)
        # Trust changes (here: re-read, same pin) while the body is still unread.
        upstream.trust_changed()
        assert await read(answer) == b"hello"
        await until(lambda: server.closed == 1)
        answer = await upstream.request(url, b"GET", b"/", Fields(), None)
        assert await read(answer) == b"hello"
        assert server.opened == 2  # a fresh, freshly verified connection
    finally:
        await upstream.close()
        await port.stopListening()


class Length(Resource):
    """Answers with the length and a digest of the body it got."""

    isLeaf = True

    def render(self, request: Any) -> bytes:
        body = request.content.read()
        return b"%d %s" % (len(body), hashlib.sha256(body).hexdigest().encode())


@pytest_twisted.ensureDeferred
async def test_a_large_body_reaches_a_peer_over_tls_whole_and_in_order(tmp_path: Path) -> None:
    """TLS keeps a buffer of its own: a large body is fed to it as it drains
    (docs/robustness.md#what-a-request-body-costs), from the handshake on."""
    from nvpair.wire.client.upstream import Upstream

    me, peer = make_identity("me"), make_identity("peer")
    peer_side = membership(tmp_path / "peer", peer, [me])
    server = Site(Length())
    port = reactor.listenSSL(0, server, Context(server_context(peer_side)), interface="127.0.0.1")
    mine = membership(tmp_path / "me", me, [peer])
    url = f"https://127.0.0.1:{port.getHost().port}"
    upstream = Upstream(reactor, 5.0, PinnedPeers(lambda: mine, lambda host, p: "peer"))
    body = bytes(range(256)) * (32 * 1024)
    expected = b"%d %s" % (len(body), hashlib.sha256(body).hexdigest().encode())
    try:
        for _ in range(2):  # a fresh connection (fed from the handshake on), then a pooled one
            answer = await upstream.request(url, b"POST", b"/", Fields(), body)
            assert await read(answer) == expected
    finally:
        await upstream.close()
        await port.stopListening()
