# -*- test-case-name: tests.wire.client.test_upstream_e2e -*-
"""The upstream client's wire duties as a client of the proxy sees them: a real facade
(FacadeSite, RequestPath, Upstream) in front of the scripted loopback engine of
``tests/rawengine.py``, asked over a raw TCP connection; and a fleet's polls through the
shared client.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.task import Clock, deferLater

from nvpair.control.state import ControlState
from nvpair.engines.table import LLAMACPP
from nvpair.facades.facade import Facade
from nvpair.fleet.polls import FleetService
from nvpair.wire.client.upstream import Upstream
from nvpair.wire.server.site import FacadeSite
from tests.fleet.test_fleet_poll import DIAL, INTERVAL, Facades, discovery_update, fleet, members
from tests.httpwire import Raw
from tests.onenode import one_node_path
from tests.rawengine import Answer, Engine, Peer, listening, reactor, stale_after_first


@pytest.fixture
def engine() -> Iterator[Engine]:
    yield from listening()


def answer(status: bytes, body: bytes = b"", *fields: bytes) -> bytes:
    head = b"HTTP/1.1 " + status + b"\r\n" + b"".join(f + b"\r\n" for f in fields)
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


MODELS = answer(b"200 OK", b'{"object":"list","data":[{"id":"m"}]}')


@contextlib.asynccontextmanager
async def facade(
    tmp_path: Path, engine: Engine, events: list[dict[str, object]] | None = None
) -> AsyncIterator[int]:
    """A llama.cpp facade whose one node is ``engine``; yields the facade's port.

    :param events: where workload events go: their fields, and ``method``.
    """
    seen: list[dict[str, object]] = [] if events is None else events
    path, upstream = one_node_path(
        tmp_path, engine.url, lambda m, p: seen.append(workload_event(m, p))
    )
    site = FacadeSite(Facade(LLAMACPP, path), 1 << 20, clock=reactor)
    listener = reactor.listenTCP(0, site, interface="127.0.0.1")
    try:
        yield listener.getHost().port
    finally:
        await upstream.close()
        await listener.stopListening()


def workload_event(method: str, params: Mapping[str, object]) -> dict[str, object]:
    info = params["workloadInfo"]
    assert isinstance(info, dict)
    return dict(info, method=method)


async def ask(port: int, method: bytes, path: bytes, body: bytes = b"") -> bytes:
    """One request on its own connection (``Connection: close``): every byte of the answer."""
    raw = Raw()
    protocol = await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), raw)
    head = b"%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" % (method, path)
    if body:
        head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    assert protocol.transport is not None
    protocol.transport.write(head + b"\r\n" + body)
    return await raw.done


def status_of(whole: bytes) -> bytes:
    return whole.split(b"\r\n", 1)[0]


def header(whole: bytes, name: bytes) -> bytes | None:
    head = whole.split(b"\r\n\r\n", 1)[0]
    for line in head.split(b"\r\n")[1:]:
        field, _, value = line.partition(b":")
        if field.strip().lower() == name:
            return value.strip()
    return None


# -- a kept-alive connection the engine closed just as the next request went out --------------


@pytest.mark.parametrize(
    ("path", "answered"),
    [(b"/props", answer(b"200 OK", b'{"n_ctx":4096}')), (b"/v1/models", MODELS)],
    ids=["other", "inventory"],
)
@pytest_twisted.ensureDeferred
async def test_a_get_on_a_stale_pooled_connection_is_answered(
    tmp_path: Path, engine: Engine, path: bytes, answered: bytes
) -> None:
    """The engine closes each kept-alive connection when its second request arrives: every
    client still gets the engine's 200, never 502 upstream-transport."""
    engine.default = stale_after_first(answered)
    async with facade(tmp_path, engine) as port:
        answers = [await ask(port, b"GET", path) for _ in range(3)]
    assert [status_of(a) for a in answers] == [b"HTTP/1.1 200 OK"] * 3
    assert [peer.count for peer in engine.peers] == [2, 2, 1]


@pytest_twisted.ensureDeferred
async def test_an_inference_post_on_a_stale_pooled_connection_is_answered(
    tmp_path: Path, engine: Engine
) -> None:
    """An inference request is sent again too: without it the failover loop would spend an
    attempt, and the node's health a failure, on the engine's idle timeout."""
    engine.default = stale_after_first(answer(b"200 OK", b'{"content":"hi"}'))
    chat = b'{"model":"m","messages":[]}'
    events: list[dict[str, object]] = []
    async with facade(tmp_path, engine, events) as port:
        answers = [await ask(port, b"POST", b"/v1/chat/completions", chat) for _ in range(2)]
    assert [status_of(a) for a in answers] == [b"HTTP/1.1 200 OK"] * 2
    assert [peer.count for peer in engine.peers] == [2, 1]
    dispatched = [
        e["id"] for e in events if e["method"] == "workload:submitted" and "scheduledOn" in e
    ]
    assert len(dispatched) == len(set(dispatched)) == 2  # the resend was no second attempt


@pytest_twisted.ensureDeferred
async def test_a_post_to_an_other_route_is_never_sent_twice(tmp_path: Path, engine: Engine) -> None:
    """An "other" POST may change state (a download, a slot save): the stale connection's
    loss is the answer, 502 upstream-transport, and the engine got the request once."""
    engine.default = stale_after_first(answer(b"200 OK", b"{}"))
    async with facade(tmp_path, engine) as port:
        first = await ask(port, b"POST", b"/slots/0?action=save", b"{}")
        second = await ask(port, b"POST", b"/slots/0?action=save", b"{}")
    assert status_of(first) == b"HTTP/1.1 200 OK"
    assert status_of(second) == b"HTTP/1.1 502 Bad Gateway"
    assert header(second, b"x-nvpair-error") == b"upstream-transport"
    assert [peer.count for peer in engine.peers] == [2]


# -- framing carried onward -----------------------------------------------------------------


@pytest.mark.parametrize("status", [b"204 No Content", b"304 Not Modified"])
@pytest_twisted.ensureDeferred
async def test_a_head_answered_204_or_304_reaches_the_client_without_content_length(
    tmp_path: Path, engine: Engine, status: bytes
) -> None:
    """The engine's Content-Length on a bodiless answer to HEAD is not passed on; a HEAD
    answer with a body's length keeps it (``test_wire_fidelity``)."""
    engine.default = b"HTTP/1.1 " + status + b"\r\nContent-Length: 5\r\nX-End: kept\r\n\r\n"
    async with facade(tmp_path, engine) as port:
        whole = await ask(port, b"HEAD", b"/props")
    assert status_of(whole) == b"HTTP/1.1 " + status
    assert header(whole, b"content-length") is None and header(whole, b"x-end") == b"kept"
    assert whole.endswith(b"\r\n\r\n")


# -- an engine that dies between its head and its body ---------------------------------------


def head_then_die(head: bytes, reset: bool) -> Answer:
    """Sends ``head``, then closes: at once, or with a reset once the head has been read (a
    reset at once could make the proxy's kernel drop the head unread)."""

    def script(peer: Peer) -> None:
        peer.wire.write(head)
        if reset:
            reactor.callLater(0.05, peer.reset)
        else:
            peer.wire.loseConnection()

    return script


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 20\r\n\r\n",
    ],
    ids=["length", "chunked", "error-status"],
)
@pytest.mark.parametrize("reset", [False, True], ids=["fin", "reset"])
@pytest.mark.parametrize("method", [b"GET", b"POST"])
@pytest_twisted.ensureDeferred
async def test_an_other_route_whose_engine_dies_after_its_head_gets_a_whole_502(
    tmp_path: Path, engine: Engine, head: bytes, method: bytes, reset: bool
) -> None:
    """Nothing of the answer was relayed yet, so the client gets the proxy's own answer,
    whole: 502 upstream-transport in the route's dialect, never an empty reply."""
    engine.default = head_then_die(head, reset)
    async with facade(tmp_path, engine) as port:
        whole = await ask(port, method, b"/props", b"{}" if method == b"POST" else b"")
    assert status_of(whole) == b"HTTP/1.1 502 Bad Gateway"
    assert header(whole, b"x-nvpair-error") == b"upstream-transport"
    body = json.loads(whole.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "upstream-transport"


@pytest_twisted.ensureDeferred
async def test_a_streamed_other_route_answer_still_streams(tmp_path: Path, engine: Engine) -> None:
    """Waiting for the first body byte holds nothing back after it: the first chunk reaches
    the client while the engine has not finished the body."""
    first_seen: Deferred[None] = Deferred()

    def stream(peer: Peer) -> None:
        peer.wire.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        reactor.callLater(0.01, peer.wire.write, b"6\r\nfirst\n\r\n")

        def rest(_: None) -> None:
            peer.wire.write(b"5\r\nlast\n\r\n0\r\n\r\n")

        first_seen.addCallback(rest)

    engine.default = stream
    async with facade(tmp_path, engine) as port:
        raw = Raw()
        protocol = await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), raw)
        assert protocol.transport is not None
        protocol.transport.write(b"GET /progress HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        while b"first" not in raw.data:
            await deferLater(reactor, 0.01)
        first_seen.callback(None)
        whole = await raw.done
    assert status_of(whole) == b"HTTP/1.1 200 OK" and b"last" in whole


# -- fleet polls -----------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_poll_on_a_stale_pooled_connection_keeps_the_node_in_discovery(
    engine: Engine,
) -> None:
    """The second poll meets the engine's close of the kept-alive connection; sent again on a
    fresh one, it reads the node's new list rather than taking the node out of discovery."""
    listed: list[list[str]] = [["m1"], ["m1", "m2"]]

    def tags(peer: Peer) -> None:
        names = listed.pop(0)
        body = json.dumps({"models": [{"name": n} for n in names]}).encode()
        peer.wire.write(answer(b"200 OK", body))

    engine.default = stale_after_first(tags)
    clock, control = Clock(), ControlState()
    upstream = Upstream(reactor, DIAL)
    service = FleetService(clock, fleet(("n", engine.url)), control, Facades(), upstream, DIAL)
    service.startService()
    try:
        await discovery_update(control, lambda m: m.get("n") == ("m1",))
        clock.advance(INTERVAL)
        await discovery_update(control, lambda m: "n" not in m or m["n"] == ("m1", "m2"))
        assert members(control) == {"n": ("m1", "m2")}
        assert [peer.count for peer in engine.peers] == [2, 1]
    finally:
        service.stopService()
        await upstream.close()
