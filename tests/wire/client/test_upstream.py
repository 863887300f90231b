# -*- test-case-name: tests.wire.client.test_upstream -*-
"""The shared upstream client (:mod:`nvpair.wire.client.upstream`): what goes on the wire,
dialling and pooling, and every kind of answer an engine can give, over real loopback sockets.

Pool timing (idle timeout, dial-time callbacks, cancelling a dial) runs on a
``MemoryReactorClock``; everything else talks to a scripted raw server on 127.0.0.1, which
shows the exact bytes the client sent and when it closed a connection.
"""

from __future__ import annotations

import io
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import reactor as _reactor
from twisted.internet.address import IPv4Address
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import (
    ConnectingCancelledError,
    ConnectionDone,
    ConnectionLost,
    ConnectionRefusedError,
)
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import ILogObserver, LogEvent, LogLevel, capturedLogs, globalLogPublisher
from twisted.python.failure import Failure
from twisted.web.client import URI, Agent
from twisted.web.error import SchemeNotSupported
from zope.interface import implementer

from nvpair.common.logs import LogObserver
from nvpair.wire.client.bodies import BodyTimeout, discard_body, read_body
from nvpair.wire.client.connection import UpstreamConnection
from nvpair.wire.client.pool import IDLE_TIMEOUT, MAX_PERSISTENT_PER_HOST, Pool
from nvpair.wire.client.upstream import Upstream, parse_target
from nvpair.wire.message import Answer, End, Ended, Fields, NoAnswer
from tests.rawengine import OK, Engine, Peer, listening, stale_after_first
from tests.wire.client.test_bodies import failure_of, result_of

#: The global reactor, untyped: its listen*/connect* generics reject plain factories.
reactor: Any = _reactor

# -- the base URL: Host and request target as Agent made them (pure) ----------------------------


@pytest.mark.parametrize(
    "base",
    [
        "http://127.0.0.1:80",
        "http://127.0.0.1:8080",
        "http://127.0.0.1",
        "https://node.lan:443",
        "https://node.lan:8443",
        "http://[::1]:8080",
        "http://[::1]",
        "http://engine.lan:11434/",
        "http://engine.lan:11434/prefix",
    ],
)
def test_the_host_header_is_agents(base: str) -> None:
    """The port only when it is not the scheme's default, as Agent's Host."""
    uri = URI.fromBytes(base.rstrip("/").encode())
    agent = Agent(MemoryReactorClock())
    expected = agent._computeHostValue(uri.scheme, uri.host, uri.port)
    assert parse_target(base).host_header == expected


@given(
    st.sampled_from(["http://127.0.0.1:8080", "http://h:1234/prefix", "https://[::1]:9/"]),
    st.text("abz09/?#;=&%.-_~", max_size=20),
)
def test_the_request_target_is_agents(base: str, rest: str) -> None:
    """Path and query as given; a fragment dropped and a base path kept, as Agent did from
    ``base + uri``."""
    uri = b"/" + rest.encode()
    expected = URI.fromBytes(base.rstrip("/").encode() + uri).originForm
    assert parse_target(base).request_target(uri) == expected


# -- dialling and pooling, in memory ------------------------------------------------------------


def closing(transport: StringTransport) -> bool:
    return bool(transport.disconnecting)


def fired(d: Deferred[Any]) -> bool:
    return bool(d.called)


def dialled(clock: MemoryReactorClock, index: int = -1) -> tuple[Any, StringTransport]:
    """Complete the ``index``th dial: the endpoint's protocol and its transport."""
    host, port, factory, _, _ = clock.tcpClients[index]
    protocol = factory.buildProtocol(IPv4Address("TCP", host, port))
    assert protocol is not None
    transport = StringTransport()
    protocol.makeConnection(transport)
    return protocol, transport


BASE = "http://127.0.0.1:8000"


def get(upstream: Upstream, connected: Callable[[], None] | None = None) -> Deferred[Answer]:
    return upstream.request(BASE, b"GET", b"/x", Fields(), None, connected)


def answered(protocol: Any, d: Deferred[Answer], answer: bytes = OK) -> Answer:
    protocol.dataReceived(answer)
    got: Answer = result_of(d)
    discard_body(got, Clock(), None, 1 << 20)
    return got


def test_connected_is_called_when_the_dial_completes() -> None:
    clock, calls = MemoryReactorClock(), []
    upstream = Upstream(clock, 5.0)
    d = get(upstream, lambda: calls.append("connected"))
    assert calls == [] and len(clock.tcpClients) == 1
    protocol, transport = dialled(clock)
    assert calls == ["connected"]
    assert transport.value() == b"GET /x HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n"
    answered(protocol, d)


def test_connected_is_called_at_once_for_a_pooled_connection() -> None:
    clock, calls = MemoryReactorClock(), []
    upstream = Upstream(clock, 5.0)
    d = get(upstream)
    protocol, transport = dialled(clock)
    answered(protocol, d)
    transport.clear()
    d = get(upstream, lambda: calls.append("connected"))
    calls.append("returned")
    assert calls == ["connected", "returned"]  # inside request(), before it returned
    assert len(clock.tcpClients) == 1 and transport.value().startswith(b"GET /x")
    answered(protocol, d)


def test_cancelling_a_dial_cancels_the_connect() -> None:
    clock, calls = MemoryReactorClock(), []
    upstream = Upstream(clock, 5.0)
    d = get(upstream, lambda: calls.append("connected"))
    d.cancel()
    failure_of(d, ConnectingCancelledError)
    assert clock.connectors[0].stoppedConnecting and calls == []


def pooled_then_lost(
    clock: MemoryReactorClock, connected: Callable[[], None] | None = None
) -> tuple[Deferred[Answer], Upstream]:
    """A GET sent on a pooled connection that then closes before any byte of its answer."""
    upstream = Upstream(clock, 5.0)
    first = get(upstream)
    protocol, _ = dialled(clock)
    answered(protocol, first)
    d = get(upstream, connected)
    protocol.connectionLost(Failure(ConnectionDone()))
    return d, upstream


def test_a_resend_is_dialled_anew_and_the_header_budget_is_not_restarted() -> None:
    """The resend's dial happens inside the header budget that began when the pooled
    connection was taken (docs/retry-budget.md#per-attempt-budgets): ``connected`` once."""
    clock, calls = MemoryReactorClock(), []
    d, _ = pooled_then_lost(clock, lambda: calls.append("connected"))
    assert len(clock.tcpClients) == 2 and not fired(d)
    fresh, wire = dialled(clock)
    assert wire.value() == b"GET /x HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n"
    assert answered(fresh, d).head.status == 200
    assert calls == ["connected"]


def test_cancelling_during_the_resends_dial_cancels_the_dial() -> None:
    clock = MemoryReactorClock()
    d, _ = pooled_then_lost(clock)
    d.cancel()
    failure_of(d, ConnectingCancelledError)
    assert clock.connectors[1].stoppedConnecting


def test_cancelling_once_the_resend_is_sent_aborts_its_connection() -> None:
    clock = MemoryReactorClock()
    d, _ = pooled_then_lost(clock)
    _, wire = dialled(clock)
    d.cancel()
    failure_of(d, CancelledError)
    assert wire.disconnected


def test_a_resent_request_that_cannot_be_dialled_fails_as_the_dial_does() -> None:
    clock = MemoryReactorClock()
    d, _ = pooled_then_lost(clock)
    connector = clock.connectors[1]
    _, _, factory, _, _ = clock.tcpClients[1]
    factory.clientConnectionFailed(connector, Failure(ConnectionRefusedError()))
    failure_of(d, ConnectionRefusedError)


def test_a_resend_that_cannot_start_fails_the_request() -> None:
    """No usable endpoint any more (a peer whose pin was withdrawn meanwhile): the request
    fails as a start failure would, and nothing raises out of the connection's loss."""
    clock = MemoryReactorClock()
    upstream = Upstream(clock, 5.0)
    first = get(upstream)
    protocol, _ = dialled(clock)
    answered(protocol, first)
    d = get(upstream)

    def withdrawn(key: object) -> Any:
        raise SchemeNotSupported("no trust for this peer any more")

    upstream._endpoints.endpoint = withdrawn  # type: ignore[method-assign]
    protocol.connectionLost(Failure(ConnectionDone()))
    failure_of(d, SchemeNotSupported)


@pytest.mark.parametrize("level", [LogLevel.info, LogLevel.debug])
def test_a_resend_is_logged_at_debug_only(level: LogLevel) -> None:
    """It is neither an attempt nor a node failure: an operator sees it only at debug."""
    observer = LogObserver(io.StringIO(), level)
    try:
        with capturedLogs() as events:
            pooled_then_lost(MemoryReactorClock())
    finally:
        observer.set_level(LogLevel.info)  # the debug gate is process-wide
    said = [e for e in events if e.get("log_namespace") == "nvpair.wire.client.upstream"]
    assert [e["log_level"] for e in said] == ([LogLevel.debug] if level is LogLevel.debug else [])


@pytest.mark.parametrize(
    ("base", "host"), [("http://127.0.0.1:8000", "127.0.0.1"), ("http://[::1]:8000", "::1")]
)
def test_an_ip_literal_is_dialled_directly(base: str, host: str) -> None:
    """No resolver thread and no HostnameEndpoint attempt tick: a refused LAN node fails over
    at once (docs/retry-budget.md#retryable-failures)."""
    clock = MemoryReactorClock()
    Upstream(clock, 5.0).request(base, b"GET", b"/", Fields(), None)
    assert [(c[0], c[1]) for c in clock.tcpClients] == [(host, 8000)]


def test_the_dial_timeout_is_the_endpoints() -> None:
    clock = MemoryReactorClock()
    get(Upstream(clock, 7.0))
    assert clock.tcpClients[0][3] == 7.0


@pytest.mark.parametrize(
    ("method", "body", "framing"),
    [
        (b"GET", None, b""),
        (b"GET", b"", b""),
        (b"DELETE", b"", b""),
        (b"POST", None, b"Content-Length: 0\r\n"),
        (b"POST", b"", b"Content-Length: 0\r\n"),
        (b"PATCH", b"", b"Content-Length: 0\r\n"),
        (b"POST", b"{}", b"Content-Length: 2\r\n"),
        (b"GET", b"{}", b"Content-Length: 2\r\n"),
    ],
)
def test_a_body_is_framed_as_agent_framed_it(
    method: bytes, body: bytes | None, framing: bytes
) -> None:
    """No body and no Content-Length for a bodiless method with an empty body; a PUT or POST
    states its empty body."""
    clock = MemoryReactorClock()
    upstream = Upstream(clock, 5.0)
    upstream.request(BASE, method, b"/x", Fields.of({b"Accept": [b"*/*"]}), body)
    _, transport = dialled(clock)
    head = method + b" /x HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nAccept: */*\r\n"
    assert transport.value() == head + framing + b"\r\n" + (body or b"")


@pytest.mark.parametrize(
    ("base", "headers", "error"),
    [
        ("ftp://127.0.0.1:21", Fields(), SchemeNotSupported),
        ("https://127.0.0.1:8443", Fields(), SchemeNotSupported),  # no TLS policy
        (BASE, Fields({b"X": [b"a\x00b"]}), ValueError),
        ("http://127.0.0.1:notaport", Fields(), Exception),
    ],
)
def test_whatever_fails_while_starting_fails_the_deferred(
    base: str, headers: Fields, error: type[Exception]
) -> None:
    d = Upstream(MemoryReactorClock(), 5.0).request(base, b"GET", b"/", headers, None)
    failure_of(d, error)


def test_the_newest_idle_connection_is_used_first() -> None:
    clock = MemoryReactorClock()
    upstream = Upstream(clock, 5.0)
    first, second = get(upstream), get(upstream)
    (p1, t1), (p2, t2) = dialled(clock, 0), dialled(clock, 1)
    answered(p1, first)
    answered(p2, second)
    t1.clear()
    t2.clear()
    get(upstream)
    assert len(clock.tcpClients) == 2 and t2.value() and not t1.value()


def test_an_idle_connection_closes_after_the_idle_timeout() -> None:
    clock = MemoryReactorClock()
    upstream = Upstream(clock, 5.0)
    d = get(upstream)
    protocol, transport = dialled(clock)
    answered(protocol, d)
    clock.advance(IDLE_TIMEOUT - 1)
    assert not closing(transport)
    clock.advance(1)
    assert closing(transport)
    get(upstream)
    assert len(clock.tcpClients) == 2  # the closed one is not handed out


def test_using_a_connection_restarts_its_idle_time() -> None:
    clock = MemoryReactorClock()
    upstream = Upstream(clock, 5.0)
    d = get(upstream)
    protocol, transport = dialled(clock)
    answered(protocol, d)
    clock.advance(IDLE_TIMEOUT - 10)
    answered(protocol, get(upstream))
    clock.advance(20)
    assert not closing(transport)
    clock.advance(IDLE_TIMEOUT)
    assert closing(transport)


def test_at_most_max_persistent_idle_connections_are_kept_per_host() -> None:
    clock = MemoryReactorClock()
    upstream = Upstream(clock, 5.0)
    count = MAX_PERSISTENT_PER_HOST + 1
    sent = [get(upstream) for _ in range(count)]
    wires = [dialled(clock, i) for i in range(count)]
    for (protocol, _), d in zip(wires, sent, strict=True):
        answered(protocol, d)
    closed = [closing(transport) for _, transport in wires]
    assert closed == [True] + [False] * MAX_PERSISTENT_PER_HOST  # the oldest went


def test_close_closes_the_idle_connections_and_waits_for_them() -> None:
    clock = MemoryReactorClock()
    upstream = Upstream(clock, 5.0)
    d = get(upstream)
    protocol, transport = dialled(clock)
    answered(protocol, d)
    closed = upstream.close()
    assert closing(transport) and not fired(closed)
    protocol.connectionLost(Failure(ConnectionLost()))
    assert fired(closed)
    assert not clock.getDelayedCalls()  # the idle sweep is gone too


PEER = (b"https", b"peer", 1)


def connection(owner: Pool) -> tuple[UpstreamConnection, StringTransport]:
    built = owner.factory(PEER).buildProtocol(None)
    assert isinstance(built, UpstreamConnection)
    transport = StringTransport()
    built.makeConnection(transport)
    return built, transport


def test_a_retired_pool_closes_idle_connections_now_and_busy_ones_when_done() -> None:
    """``trust_changed`` retires the peer pool: nothing verified under the old trust is used
    again."""
    pool = Pool(Clock(), 4, IDLE_TIMEOUT)
    idle, idle_transport = connection(pool)
    busy, busy_transport = connection(pool)
    pool.keep(PEER, idle)
    pool.retire()
    assert closing(idle_transport) and not closing(busy_transport)
    pool.keep(PEER, busy)
    assert closing(busy_transport)
    assert pool.take(PEER) is None


# -- a scripted engine on loopback -------------------------------------------------------------


@pytest.fixture
def engine() -> Iterator[Engine]:
    yield from listening()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    client = Upstream(reactor, 5.0)
    yield client
    pytest_twisted.blockon(client.close())


async def fetch(upstream: Upstream, engine: Engine, method: bytes = b"GET") -> bytes:
    answer = await upstream.request(engine.url, method, b"/v1/models", Fields(), None)
    return await read_body(answer, reactor, 5.0, 1 << 20)


def chunked(*chunks: bytes) -> bytes:
    body = b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in chunks)
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n"


@pytest_twisted.ensureDeferred
async def test_the_request_on_the_wire(engine: Engine, upstream: Upstream) -> None:
    headers = Fields.of({b"Content-Type": [b"application/json"], b"X-Multi": [b"a", b"b"]})
    answer = await upstream.request(engine.url, b"POST", b"/api/chat?x=1", headers, b"{}")
    assert await read_body(answer, reactor, 5.0, 100) == b"{}"
    port = engine.url.rsplit(":", 1)[1].encode()
    assert engine.requests == [
        b"POST /api/chat?x=1 HTTP/1.1\r\n"
        b"Host: 127.0.0.1:" + port + b"\r\n"
        b"Content-Type: application/json\r\n"
        b"X-Multi: a\r\n"
        b"X-Multi: b\r\n"
        b"Content-Length: 2\r\n"
        b"\r\n"
        b"{}"
    ]


@pytest_twisted.ensureDeferred
async def test_keep_alive_carries_one_request_after_another(
    engine: Engine, upstream: Upstream
) -> None:
    engine.answers = [OK, chunked(b"he", b"llo"), b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"]
    assert [await fetch(upstream, engine) for _ in range(3)] == [b"{}", b"hello", b""]
    assert len(engine.peers) == 1


@pytest_twisted.ensureDeferred
async def test_a_discarded_body_returns_its_connection_to_the_pool(
    engine: Engine, upstream: Upstream
) -> None:
    for _ in range(3):
        answer = await upstream.request(engine.url, b"GET", b"/", Fields(), None)
        await discard_body(answer, reactor, 5.0, 1 << 20)
    assert len(engine.requests) == 3 and len(engine.peers) == 1


@pytest_twisted.ensureDeferred
async def test_a_head_answer_with_content_length_ends_at_its_head(
    engine: Engine, upstream: Upstream
) -> None:
    engine.answers = [b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n", OK]
    answer = await upstream.request(engine.url, b"HEAD", b"/props", Fields(), None)
    assert answer.head.fields.all_of(b"content-length") == [b"20"]
    assert await read_body(answer, reactor, 5.0, 100) == b""
    assert await fetch(upstream, engine) == b"{}"
    assert len(engine.peers) == 1  # the HEAD's connection was reused


@pytest_twisted.ensureDeferred
async def test_a_204_with_a_body_is_not_reused(engine: Engine, upstream: Upstream) -> None:
    engine.answers = [b"HTTP/1.1 204 No Content\r\n\r\nstray bytes"]
    assert await fetch(upstream, engine) == b""
    await engine.lost(0)
    assert await fetch(upstream, engine) == b"{}"
    assert len(engine.peers) == 2


@pytest_twisted.ensureDeferred
async def test_two_answers_in_one_segment_deliver_the_first_and_close(
    engine: Engine, upstream: Upstream
) -> None:
    engine.answers = [OK + b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nxyz"]
    assert await fetch(upstream, engine) == b"{}"
    await engine.lost(0)
    assert await fetch(upstream, engine) == b"{}"
    assert len(engine.peers) == 2


@pytest_twisted.ensureDeferred
async def test_an_answer_before_the_body_was_sent_is_the_answer(
    engine: Engine, upstream: Upstream
) -> None:
    """The engine answers on the head of a large request; the client's body is still in its
    send buffer. The answer is taken, and the connection stays in step for the next one."""
    engine.early = True
    body = b"x" * (8 << 20)
    answer = await upstream.request(engine.url, b"POST", b"/", Fields(), body)
    assert engine.peers[0].skip > 0  # the engine had not read the whole request yet
    assert answer.head.status == 200 and await read_body(answer, reactor, 5.0, 100) == b"{}"
    assert await fetch(upstream, engine) == b"{}"
    assert len(engine.peers) == 1 and engine.requests[1].startswith(b"GET /v1/models")


@pytest_twisted.ensureDeferred
async def test_a_garbage_status_line_is_never_received(engine: Engine, upstream: Upstream) -> None:
    engine.answers = [b"SSH-2.0-OpenSSH_9.6\r\n\r\n"]
    with pytest.raises(NoAnswer):
        await fetch(upstream, engine)
    await engine.lost(0)


@pytest_twisted.ensureDeferred
async def test_a_header_over_64_kib_is_never_received(engine: Engine, upstream: Upstream) -> None:
    engine.answers = [b"HTTP/1.1 200 OK\r\nX-Big: " + b"x" * (70 << 10) + b"\r\n\r\n"]
    with pytest.raises(NoAnswer):
        await fetch(upstream, engine)
    await engine.lost(0)


@pytest_twisted.ensureDeferred
async def test_an_endless_head_is_cut_off(engine: Engine, upstream: Upstream) -> None:
    """An engine streaming header lines without end: refused past the cap, not buffered."""

    def endless(peer: Peer) -> None:
        peer.wire.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(2000):
            peer.wire.write(b"X-Filler: " + b"y" * 100 + b"\r\n")

    engine.answers = [endless]
    with pytest.raises(NoAnswer):
        await fetch(upstream, engine)
    await engine.lost(0)


@pytest_twisted.ensureDeferred
async def test_a_chunk_size_overflow_fails_the_body(engine: Engine, upstream: Upstream) -> None:
    engine.answers = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffffffff\r\n"
    ]
    answer = await upstream.request(engine.url, b"GET", b"/v1/models", Fields(), None)
    ended: Deferred[Ended] = Deferred()

    class Body:
        def data(self, data: bytes) -> None:
            raise AssertionError(f"no chunk of a broken body is read: {data!r}")

        def end(self, how: Ended) -> None:
            ended.callback(how)

    answer.body.connect(Body())
    how = await ended
    assert how.how is End.BROKEN and how.error is not None
    await engine.lost(0)


@pytest_twisted.ensureDeferred
async def test_a_reset_mid_body_fails_the_body(engine: Engine, upstream: Upstream) -> None:
    engine.answers = [b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhalf"]
    answer = await upstream.request(engine.url, b"GET", b"/", Fields(), None)
    got: Deferred[bytes] = Deferred()
    ended: Deferred[Ended] = Deferred()

    class Body:
        def data(self, data: bytes) -> None:
            got.callback(data)

        def end(self, how: Ended) -> None:
            ended.callback(how)

    answer.body.connect(Body())
    assert await got == b"half"
    engine.peers[0].reset()
    how = await ended
    assert how.how is End.CUT and isinstance(how.error, ConnectionLost)


@pytest_twisted.ensureDeferred
async def test_a_stall_after_the_head_is_cut_by_the_readers_bound(
    engine: Engine, upstream: Upstream
) -> None:
    """Nothing waits for ever on a silent engine: the body bound closes the connection."""
    engine.answers = [b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{"]
    answer = await upstream.request(engine.url, b"GET", b"/", Fields(), None)
    clock = Clock()
    d = read_body(answer, clock, 30.0, 1 << 20)
    clock.advance(30)
    failure_of(d, BodyTimeout)
    await engine.lost(0)


@pytest_twisted.ensureDeferred
async def test_cancelling_before_the_head_closes_the_connection(
    engine: Engine, upstream: Upstream
) -> None:
    engine.answers = [lambda peer: None]  # never answers
    d = upstream.request(engine.url, b"POST", b"/api/chat", Fields(), b"{}")
    await engine.until(lambda: bool(engine.requests))
    d.cancel()
    failure_of(d, CancelledError)
    await engine.lost(0)


@pytest_twisted.ensureDeferred
async def test_a_refused_dial_fails_as_the_endpoint_reports_it(upstream: Upstream) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(ConnectionRefusedError):
        await upstream.request(f"http://127.0.0.1:{port}", b"GET", b"/", Fields(), None)


@implementer(ILogObserver)
class Events:
    def __init__(self) -> None:
        self.seen: list[LogEvent] = []

    def __call__(self, event: LogEvent) -> None:
        self.seen.append(event)


@pytest.fixture
def events() -> Iterator[Events]:
    events = Events()
    globalLogPublisher.addObserver(events)
    yield events
    globalLogPublisher.removeObserver(events)


@pytest_twisted.ensureDeferred
async def test_connections_log_nothing(engine: Engine, upstream: Upstream, events: Events) -> None:
    """No per-connection lines ("Starting factory", "Stopping factory") at any level."""
    engine.answers = [OK, b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"]
    assert await fetch(upstream, engine) == b"{}"
    assert await fetch(upstream, engine) == b""
    await engine.lost(0)
    assert await fetch(upstream, engine) == b"{}"
    factory_lines = [e for e in events.seen if "factory" in str(e.get("log_format", "")).lower()]
    assert factory_lines == []


# -- a kept-alive connection the engine closes as the next request arrives -----------------------


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "reset"])
@pytest.mark.parametrize(("method", "resend"), [(b"GET", False), (b"POST", True)])
@pytest_twisted.ensureDeferred
async def test_a_request_on_a_stale_kept_alive_connection_is_sent_again_once(
    engine: Engine, upstream: Upstream, method: bytes, resend: bool, reset: bool
) -> None:
    """The engine closes (or resets) each connection when its second request arrives: that
    request is sent once more on a fresh connection to the same engine and answered there."""
    engine.default = stale_after_first(reset=reset)
    for _ in range(3):
        answer = await upstream.request(engine.url, method, b"/x", Fields(), b"{}", None, resend)
        assert answer.head.status == 200 and await read_body(answer, reactor, 5.0, 100) == b"{}"
    # 1st: a fresh connection; 2nd: its reuse closed, sent again on a 2nd connection; 3rd the same.
    assert [peer.count for peer in engine.peers] == [2, 2, 1]
    assert len({bytes(r) for r in engine.requests}) == 1 and len(engine.requests) == 5


@pytest_twisted.ensureDeferred
async def test_a_post_the_caller_did_not_mark_resendable_is_not_sent_again(
    engine: Engine, upstream: Upstream
) -> None:
    engine.default = stale_after_first()
    assert await fetch(upstream, engine, b"POST") == b"{}"
    with pytest.raises(NoAnswer):
        await fetch(upstream, engine, b"POST")
    assert len(engine.requests) == 2 and len(engine.peers) == 1


@pytest_twisted.ensureDeferred
async def test_a_fresh_connection_that_closes_is_never_resent(
    engine: Engine, upstream: Upstream
) -> None:
    engine.default = lambda peer: peer.wire.loseConnection()
    with pytest.raises(NoAnswer):
        await fetch(upstream, engine)
    assert len(engine.requests) == 1


@pytest_twisted.ensureDeferred
async def test_a_resend_whose_fresh_connection_closes_too_fails(
    engine: Engine, upstream: Upstream
) -> None:
    """Sent again once, never twice: the engine closing the fresh connection ends it."""
    engine.answers = [OK]
    engine.default = lambda peer: peer.wire.loseConnection()
    assert await fetch(upstream, engine) == b"{}"
    with pytest.raises(NoAnswer):
        await fetch(upstream, engine)
    assert [peer.count for peer in engine.peers] == [2, 1]


def test_a_kept_connection_lost_while_idle_is_never_handed_out() -> None:
    """The pool is not told of a close (a connection knows nothing of its pool): it finds out
    when it would hand the connection out."""
    pool = Pool(Clock(), 4, IDLE_TIMEOUT)
    gone, _ = connection(pool)
    kept, _ = connection(pool)
    pool.keep(PEER, kept)
    pool.keep(PEER, gone)
    gone.connectionLost(Failure(ConnectionDone()))
    assert pool.take(PEER) is kept
    assert pool.take(PEER) is None


def test_the_sweep_closes_what_went_idle_too_long_and_forgets_what_was_lost() -> None:
    clock = Clock()
    pool = Pool(clock, 4, IDLE_TIMEOUT)
    old, old_transport = connection(pool)
    pool.keep(PEER, old)
    clock.advance(IDLE_TIMEOUT / 2)
    young, young_transport = connection(pool)
    lost, _ = connection(pool)
    pool.keep(PEER, young)
    pool.keep(PEER, lost)
    lost.connectionLost(Failure(ConnectionDone()))
    clock.advance(IDLE_TIMEOUT / 2)
    assert closing(old_transport) and not closing(young_transport)
    assert pool.take(PEER) is young and pool.take(PEER) is None
