"""Event feeds are relayed at their head (issue 32 item 4; docs/request-path.md#event-feeds):
a 2xx ``text/event-stream`` answer on a route that is not inference reaches the client as soon
as its head arrives, not with its first event; an inference answer still commits at its first
body byte. A real facade over loopback in front of an engine that sends a head and waits, and
the decision itself, pure."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from nvpair.control.state import Node
from nvpair.dispatch import attempt
from nvpair.dispatch.attempt import Outgoing
from nvpair.engines.table import LLAMACPP, RouteClass
from nvpair.facades.facade import Facade
from nvpair.wire.message import Fields
from nvpair.wire.server.site import FacadeSite
from tests.fakes import Response
from tests.onenode import one_node_path

#: The global reactor, untyped: its listen*/connect* generics reject plain factories.
reactor: Any = _reactor

#: Only the test's failure guard: a head that has not come by then never will.
PATIENCE = 10.0

FEED_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
LLAMA_NODE = Node("a", False, "http://a", ("m",), frozenset({"m"}), engine="llamacpp")
EVENT = b'data: {"model":"m","status":"loaded"}\n\n'


class Feed(Protocol):
    """The engine's side: answers any request with the feed's head, then waits."""

    def __init__(self, peers: list[Feed]) -> None:
        self.peers = peers

    def dataReceived(self, data: bytes) -> None:
        if b"\r\n\r\n" in data and self not in self.peers:
            self.peers.append(self)
            assert self.transport is not None
            self.transport.write(FEED_HEAD)

    def event(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))


class Client(Protocol):
    """Keeps what the facade writes; :meth:`until` waits for some of it to arrive."""

    def __init__(self) -> None:
        self.data = b""
        self._waiting: list[tuple[bytes, Deferred[bytes]]] = []

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        for wanted, waiter in list(self._waiting):
            if wanted in self.data:
                self._waiting.remove((wanted, waiter))
                waiter.callback(self.data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        for _, waiter in self._waiting:
            waiter.errback(reason)

    def until(self, wanted: bytes) -> Deferred[bytes]:
        waiter: Deferred[bytes] = Deferred()
        if wanted in self.data:
            waiter.callback(self.data)
            return waiter
        self._waiting.append((wanted, waiter))
        return waiter.addTimeout(PATIENCE, reactor)


@contextlib.asynccontextmanager
async def facade(tmp_path: Path) -> AsyncIterator[tuple[int, list[Feed]]]:
    peers: list[Feed] = []
    engine = reactor.listenTCP(0, Factory.forProtocol(lambda: Feed(peers)), interface="127.0.0.1")
    path, upstream = one_node_path(tmp_path, f"http://127.0.0.1:{engine.getHost().port}")
    listener = reactor.listenTCP(
        0, FacadeSite(Facade(LLAMACPP, path), 1 << 20, clock=reactor), interface="127.0.0.1"
    )
    try:
        yield listener.getHost().port, peers
    finally:
        for peer in peers:
            if peer.transport is not None:
                peer.transport.loseConnection()
        await upstream.close()
        await listener.stopListening()
        await engine.stopListening()


async def connect(port: int, request: bytes) -> Client:
    client = Client()
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), client)
    assert client.transport is not None
    client.transport.write(request)
    return client


async def engine_asked(peers: list[Feed]) -> Feed:
    """The engine connection once it has answered its head (a real wait, bounded)."""
    for _ in range(int(PATIENCE / 0.01)):
        if peers:
            return peers[0]
        await deferLater(0.01)
    raise AssertionError("the engine was never asked")


def deferLater(seconds: float) -> Deferred[None]:
    waiter: Deferred[None] = Deferred()
    reactor.callLater(seconds, waiter.callback, None)
    return waiter


@pytest_twisted.ensureDeferred
async def test_a_feeds_head_reaches_the_client_before_any_event(tmp_path: Path) -> None:
    """The router's ``GET /models/sse``: the client sees the stream open while the engine has
    sent nothing but its head, and each event as it comes."""
    async with facade(tmp_path) as (port, peers):
        client = await connect(port, b"GET /models/sse HTTP/1.1\r\nHost: localhost\r\n\r\n")
        received = await client.until(b"\r\n\r\n")
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        assert b"text/event-stream" in head.lower() and b"x-nvpair-node: gpu-1" in head.lower()
        assert body == b""
        (await engine_asked(peers)).event(EVENT)
        assert EVENT in await client.until(EVENT)


@pytest.mark.parametrize(
    ("route", "method", "uri", "status", "content_type", "at_head"),
    [
        (RouteClass.OTHER, b"GET", b"/models/sse", 200, b"text/event-stream", True),
        (RouteClass.OTHER, b"GET", b"/x", 200, b"Text/Event-Stream ; charset=utf-8", True),
        (RouteClass.OTHER, b"GET", b"/models/sse", 404, b"text/event-stream", False),
        (RouteClass.OTHER, b"GET", b"/props", 200, b"application/json", False),
        (RouteClass.INFERENCE, b"POST", b"/v1/chat/completions", 200, b"text/event-stream", False),
        (RouteClass.PEER, b"POST", b"/v1/chat/completions?x=1", 200, b"text/event-stream", False),
        (RouteClass.PEER, b"GET", b"/models/sse?x=1", 200, b"text/event-stream", True),
    ],
)
def test_which_answers_commit_at_their_head(
    route: RouteClass, method: bytes, uri: bytes, status: int, content_type: bytes, at_head: bool
) -> None:
    """Only a 2xx event stream that is not an inference answer; an inference stream still
    commits at its first byte (docs/request-path.md#the-commit-point), and a peer's request is
    classed by its path."""
    outgoing = Outgoing(route, method, uri, Fields(), b"")
    response = Response(status, b"", Headers({b"Content-Type": [content_type]}))
    assert attempt.relayed_at_head(outgoing, LLAMA_NODE, response.head) is at_head
