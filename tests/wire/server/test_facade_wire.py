"""HTTP/1.1 at the facade's client hop, through a real listener and real clients (issue 19).

Each rule of "HTTP/1.1 on both hops" that the facade server owns is driven here over loopback
sockets: a raw Twisted client where the exact bytes matter, Python's ``http.client`` and
``ssl`` (in a thread: they block), and curl. The request path is a stand-in that answers by
path, except where the rule is about what reaches an engine: there the real request path and
upstream client run in front of a small twisted.web engine.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import defer
from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import ServerFactory
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.internet.utils import getProcessOutputAndValue
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from nvpair.engines.table import LLAMACPP, OLLAMA
from nvpair.facades.facade import Admitted, Facade, RequestHandler
from nvpair.facades.peer import PeerFacade
from nvpair.wire.message import COMPLETE, Fields, ResponseHead
from nvpair.wire.server.body_budget import BodyBudget
from nvpair.wire.server.site import FacadeSite
from nvpair.wire.trust.cluster import Membership, load_membership
from nvpair.wire.trust.sniffing import SniffingFactory
from nvpair.wire.web import ProxiedRequest
from tests import httpwire
from tests.certs import NodeIdentity, make_identity, write_cluster_dir
from tests.httpwire import Raw, WireResponse, read_stream
from tests.onenode import one_node_path

#: The global reactor, untyped: its listen*/connect* generics reject our factories.
reactor: Any = _reactor

#: How long a client here waits for the server to close before the test fails.
PATIENCE = 10.0

CAP = 1024


class Served(RequestHandler):
    """The request path's stand-in: answers by path, and keeps what each request carried."""

    def __init__(self) -> None:
        self.admitted: list[Admitted] = []
        self.headers: list[list[tuple[bytes, list[bytes]]]] = []

    def handle(self, admitted: Admitted, request: ProxiedRequest) -> Deferred[None]:
        self.admitted.append(admitted)
        self.headers.append(list(request.head.fields.items()))
        if admitted.path in ("/nothing", "/cached"):
            # An engine's length on a bodiless status (a HEAD relayed with its 204, say).
            status = 204 if admitted.path == "/nothing" else 304
            request.respond(ResponseHead(status, fields=Fields.of([(b"Content-Length", b"20")])))
        elif admitted.path == "/stream":
            request.respond(ResponseHead(200))
            request.data(b"streamed ")
            request.data(b"without a length")
        else:
            body = b"%s %s %s" % (admitted.method, admitted.path.encode(), admitted.body)
            length = Fields.of([(b"Content-Length", b"%d" % len(body))])
            request.respond(ResponseHead(200, fields=length))
            request.data(body)
        request.end(COMPLETE)
        return defer.succeed(None)


@contextlib.asynccontextmanager
async def listening(factory: ServerFactory) -> AsyncIterator[int]:
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    try:
        yield port.getHost().port
    finally:
        await port.stopListening()


def site(handler: RequestHandler, cap: int = CAP) -> FacadeSite:
    return FacadeSite(Facade(LLAMACPP, handler), cap, clock=reactor)


async def talk(port: int, data: bytes) -> bytes:
    """:func:`tests.httpwire.talk`, as patient as every client here."""
    return await httpwire.talk(reactor, port, data, PATIENCE)


def request(method: str, path: str, *lines: str, body: bytes = b"", version: str = "1.1") -> bytes:
    head = f"{method} {path} HTTP/{version}\r\n" + "".join(f"{line}\r\n" for line in lines)
    return head.encode() + b"\r\n" + body


def post(path: str, body: bytes, *lines: str) -> bytes:
    return request(
        "POST", path, "Host: localhost", f"Content-Length: {len(body)}", *lines, body=body
    )


def error_of(response: WireResponse) -> tuple[str | None, str]:
    """The reason and the message of a proxy-generated answer (llama.cpp's dialect)."""
    reason = response.value(b"x-nvpair-error")
    document = json.loads(response.body)
    return None if reason is None else reason.decode(), document["error"]["message"]


# -- closing after the answer, on both personalities -------------------------------------


@pytest_twisted.ensureDeferred
async def test_connection_close_and_http_1_0_get_their_answer_then_the_close() -> None:
    """RFC 9112 §9.6, §9.3; HTTP/1.0 never gets chunked framing (it has none)."""
    handler = Served()
    async with listening(site(handler)) as port:
        closing = await talk(port, request("GET", "/a", "Host: x", "Connection: close"))
        old = await talk(port, request("GET", "/stream", version="1.0"))
    (response,) = read_stream(closing, [b"GET"], closed=True)
    assert response.value(b"connection") == b"close" and response.body == b"GET /a "
    (response,) = read_stream(old, [b"GET"], closed=True)
    assert response.version == b"HTTP/1.0" and response.close_delimited
    assert response.values(b"transfer-encoding") == []
    assert response.body == b"streamed without a length"


@contextlib.asynccontextmanager
async def cluster_port(tmp_path: Path, handler: RequestHandler) -> AsyncIterator[int]:
    """A facade port whose TLS personality serves pinned peers: this node is alice, and bob
    is pinned."""
    directory = write_cluster_dir(tmp_path / "alice", ALICE, [BOB])
    membership = load_membership(directory)
    assert membership is not None

    def member() -> Membership | None:
        return membership

    factory = SniffingFactory(
        reactor,
        site(handler),
        FacadeSite(PeerFacade(LLAMACPP, handler, member), CAP, clock=reactor),
        member,
    )
    async with listening(factory) as port:
        yield port


ALICE, BOB = make_identity("alice"), make_identity("bob")


def tls_talk(port: int, me: NodeIdentity, directory: Path, data: bytes) -> tuple[bytes, bool]:
    """As a pinned peer: write ``data``, read until the server closes or PATIENCE passes.

    :returns: what was read, and whether the server closed.
    """
    (directory / "peer.crt").write_bytes(me.cert_pem)
    (directory / "peer.key").write_bytes(me.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    # Pins, not chains, identify a member (docs/cluster.md); the server's pin is not the point.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.load_cert_chain(directory / "peer.crt", directory / "peer.key")
    received = b""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=PATIENCE) as plain,
        context.wrap_socket(plain) as tls,
    ):
        tls.sendall(data)
        try:
            while chunk := tls.recv(65536):
                received += chunk
        except TimeoutError:
            return received, False
    return received, True


@pytest_twisted.ensureDeferred
async def test_over_pinned_tls_connection_close_and_http_1_0_close_after_the_answer(
    tmp_path: Path,
) -> None:
    """Finding 6: over TLS the connection stayed open after the answer to ``Connection:
    close`` (a TLS transport holds its close while a producer is registered with it)."""
    handler = Served()
    async with cluster_port(tmp_path, handler) as port:
        closing, closed = await deferToThread(
            tls_talk, port, BOB, tmp_path, request("GET", "/a", "Host: x", "Connection: close")
        )
        assert closed, "the answer came, but the connection stayed open"
        old, old_closed = await deferToThread(
            tls_talk, port, BOB, tmp_path, request("GET", "/stream", version="1.0")
        )
    (response,) = read_stream(closing, [b"GET"], closed=True)
    assert response.status == 200 and response.value(b"connection") == b"close"
    assert old_closed
    (response,) = read_stream(old, [b"GET"], closed=True)
    assert response.close_delimited and response.values(b"transfer-encoding") == []
    assert [a.route.value for a in handler.admitted] == ["peer", "peer"]


# -- what the head must carry --------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_host_missing_or_repeated_is_400_naming_it_and_http_1_0_needs_none() -> None:
    """RFC 9112 §3.2."""
    handler = Served()
    async with listening(site(handler)) as port:
        missing = await talk(port, request("GET", "/a", "Connection: close"))
        twice = await talk(port, request("GET", "/a", "Host: a", "Host: b"))
        old = await talk(port, request("GET", "/a", version="1.0"))
    (response,) = read_stream(missing, [b"GET"], closed=True)
    assert response.status == 400
    assert error_of(response) == ("bad-request", "an HTTP/1.1 request must carry a Host header")
    (response,) = read_stream(twice, [b"GET"], closed=True)
    assert response.status == 400
    assert error_of(response) == (
        "bad-request",
        "a request must carry one Host header, not several",
    )
    (response,) = read_stream(old, [b"GET"], closed=True)
    assert response.status == 200 and [a.path for a in handler.admitted] == ["/a"]


@pytest_twisted.ensureDeferred
async def test_every_400_says_what_was_wrong() -> None:
    async with listening(site(Served())) as port:
        answers = [
            await talk(port, raw)
            for raw in [
                request("GET", "/a", "Host localhost"),
                request("GET", "/a", "Host: x", "X-Big: " + "b" * 17000),
                request("GET", "/a", "Host: x", version="2.0"),
                request("GET", "*", "Host: x"),
                request("POST", "/a", "Host: x", "Content-Length: 1", "Content-Length: 2"),
            ]
        ]
    messages = [error_of(read_stream(a, [b"GET"], closed=True)[0]) for a in answers]
    assert messages == [
        ("bad-request", "malformed request: Invalid header token"),
        ("bad-request", "the request line and headers are over 16 KiB"),
        ("bad-request", "only HTTP/1.0 and HTTP/1.1 are served"),
        (
            "bad-request",
            "a target must be in origin form (/path) or absolute form (http://host/path)",
        ),
        ("bad-request", "malformed request: Duplicate Content-Length"),
    ]


@pytest_twisted.ensureDeferred
async def test_a_transfer_coding_other_than_chunked_is_501_not_implemented() -> None:
    """RFC 9112 §6.1: ``gzip, chunked`` is framed by llhttp, but its body is still gzip."""
    handler = Served()
    async with listening(site(handler)) as port:
        answers = [
            await talk(port, request("POST", "/a", "Host: x", f"Transfer-Encoding: {te}"))
            for te in ["gzip, chunked", "chunked, gzip", "gzip", "identity"]
        ]
    for answer in answers:
        (response,) = read_stream(answer, [b"POST"], closed=True)
        assert response.status == 501
        assert error_of(response) == (
            "not-implemented",
            "the only request transfer coding implemented is chunked",
        )
    assert handler.admitted == []


# -- methods ---------------------------------------------------------------------------------


class Engine(Resource):
    """A twisted.web engine that notes every request: method, path and connection."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[bytes, bytes]] = []
        self.held: list[Any] = []
        self.first: Deferred[None] = Deferred()
        self.cancelled: Deferred[None] = Deferred()

    def render(self, request: Any) -> bytes | int:
        self.seen.append((request.method, request.path))
        if request.path == b"/completion":
            # A slow engine: the answer never comes; the proxy dropping the attempt is seen.
            self.held.append(request)
            request.notifyFinish().addErrback(lambda _: self.cancelled.callback(None))
            if not self.first.called:
                self.first.callback(None)
            return NOT_DONE_YET
        return b"{}"


@contextlib.asynccontextmanager
async def proxied(tmp_path: Path, engine: Engine) -> AsyncIterator[int]:
    """The real request path and upstream client, in front of ``engine``."""
    engine_port = reactor.listenTCP(0, Site(engine), interface="127.0.0.1")
    path, upstream = one_node_path(tmp_path, f"http://127.0.0.1:{engine_port.getHost().port}")
    try:
        async with listening(site(path)) as port:
            yield port
    finally:
        await upstream.close()
        await engine_port.stopListening()


@pytest_twisted.ensureDeferred
async def test_an_extension_method_is_forwarded_and_one_llhttp_cannot_carry_is_501(
    tmp_path: Path,
) -> None:
    """RFC 9110 §9.1: never 400 for a method."""
    engine = Engine()
    async with proxied(tmp_path, engine) as port:
        carried = [
            await talk(port, request(method, "/props", "Host: x", "Connection: close"))
            for method in ["PROPFIND", "PURGE", "REPORT"]
        ]
        unknown = await talk(port, request("FOO", "/props", "Host: x"))
    assert [read_stream(a, [b"X"], closed=True)[0].status for a in carried] == [200] * 3
    assert engine.seen == [(b"PROPFIND", b"/props"), (b"PURGE", b"/props"), (b"REPORT", b"/props")]
    (response,) = read_stream(unknown, [b"FOO"], closed=True)
    assert response.status == 501
    assert error_of(response) == (
        "not-implemented",
        "the request method is not one this proxy can carry",
    )


@pytest_twisted.ensureDeferred
async def test_connect_is_501_not_a_tunnel() -> None:
    handler = Served()
    async with listening(site(handler)) as port:
        answer = await talk(port, request("CONNECT", "example.com:443", "Host: example.com:443"))
    (response,) = read_stream(answer, [b"CONNECT"], closed=True)
    assert response.status == 501 and error_of(response)[0] == "not-implemented"
    assert handler.admitted == []


# -- upgrade offers, trailers, bodies ------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_curl_http2_over_plain_http_is_served_as_http_1_1_body_and_all() -> None:
    """Finding 4: ``curl --http2 http://`` offers h2c; the offer was taken as the end of
    HTTP/1.1, the body lost (400 bad-json) and the next request on the connection ignored."""
    handler = Served()
    async with listening(site(handler)) as port:
        url = f"http://127.0.0.1:{port}"
        out, err, code = await getProcessOutputAndValue(
            "curl",
            [
                "-sS",
                "--max-time",
                str(PATIENCE),
                *("--http2", "-d", '{"prompt":"hi"}', "-w", "\n%{http_code} %{num_connects}\n"),
                f"{url}/completion",
                "--next",
                *("--http2", "-w", "\n%{http_code} %{num_connects}\n", f"{url}/health"),
            ],
        )
    assert code == 0, err
    assert out.decode().splitlines() == [
        'POST /completion {"prompt":"hi"}',
        "200 1",
        "GET /health ",
        # The same connection served the second request.
        "200 0",
    ]


@pytest_twisted.ensureDeferred
async def test_trailer_fields_of_a_chunked_request_are_dropped() -> None:
    handler = Served()
    body = b'7\r\n{"a":1}\r\n0\r\nX-Checksum: abc\r\nHost: evil.example\r\n\r\n'
    async with listening(site(handler)) as port:
        answer = await talk(
            port,
            request("POST", "/a", "Host: x", "Transfer-Encoding: chunked", "Connection: close")
            + body,
        )
    (response,) = read_stream(answer, [b"POST"], closed=True)
    assert response.body == b'POST /a {"a":1}'
    (headers,) = handler.headers
    assert [name.lower() for name, _ in headers] == [b"host", b"transfer-encoding", b"connection"]
    assert dict(headers)[b"Host"] == [b"x"]


@pytest_twisted.ensureDeferred
async def test_expect_100_continue_gets_the_interim_answer_once_admitted_or_the_refusal(
    tmp_path: Path,
) -> None:
    """curl sends ``Expect: 100-continue`` and waits for it before the body."""
    handler = Served()
    small, large = tmp_path / "small.json", tmp_path / "large.json"
    small.write_bytes(b'{"x":"' + b"s" * 500 + b'"}')
    large.write_bytes(b'{"x":"' + b"l" * 5000 + b'"}')
    async with listening(site(handler)) as port:
        url = f"http://127.0.0.1:{port}/completion"
        results = [
            await getProcessOutputAndValue(
                "curl",
                [
                    "-sS",
                    "-v",
                    *("--max-time", str(PATIENCE), "--expect100-timeout", str(PATIENCE)),
                    *("-H", "Expect: 100-continue", "--data-binary", f"@{body}", url),
                ],
            )
            for body in (small, large)
        ]
    (out, err, code), (large_out, large_err, large_code) = results
    assert code == 0 and b"< HTTP/1.1 100 Continue" in err and out.endswith(b's"}')
    assert large_code == 0 and b"100 Continue" not in large_err
    assert b"< HTTP/1.1 413 " in large_err
    assert json.loads(large_out)["error"]["code"] == "body-too-large"
    assert [len(a.body) for a in handler.admitted] == [small.stat().st_size]


def post_over_the_cap(port: int, size: int) -> tuple[int, str | None, bytes]:
    """What Python's http.client does: write the whole body, then read the answer."""
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=PATIENCE)
    try:
        client.connect()
        assert client.sock is not None
        # A small send buffer keeps the client writing until the proxy has read the body: with
        # loopback's large buffers it could otherwise be done before a close arrived.
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)
        client.request("POST", "/completion", body=b"x" * size)
        response = client.getresponse()
        return response.status, response.getheader("X-Nvpair-Error"), response.read()
    finally:
        client.close()


@pytest_twisted.ensureDeferred
async def test_a_client_that_writes_its_whole_body_first_reads_the_413() -> None:
    """Lingering close: closing at the head, with megabytes still coming, reset the connection
    and the client never saw the answer."""
    handler = Served()
    async with listening(site(handler)) as port:
        status, reason, body = await deferToThread(post_over_the_cap, port, 3 * 1024 * 1024)
    assert (status, reason) == (413, "body-too-large")
    assert json.loads(body)["error"]["code"] == "body-too-large"
    assert handler.admitted == []


def write_then_read(port: int, head: bytes, size: int) -> bytes:
    """What a client that sends its whole body before it reads does (curl with a large upload,
    ``requests``): every byte written, then the answer read to the close. A reset on the way
    (``BrokenPipeError``, ``ConnectionResetError``) fails the caller."""
    piece = b"x" * (1 << 20)
    with socket.create_connection(("127.0.0.1", port), timeout=PATIENCE) as client:
        client.sendall(head)
        for at in range(0, size, len(piece)):
            client.sendall(piece[: size - at])
        answer = b""
        while data := client.recv(65536):
            answer += data
        return answer


@pytest_twisted.ensureDeferred
async def test_a_client_that_writes_100_mib_over_the_cap_first_reads_the_413() -> None:
    """Issue 29 item 7: lingering for 4 MiB, the proxy closed with most of the body unread and
    the client got ``BrokenPipeError``; nginx answers 413. Up to 128 MiB are read and dropped."""
    size = 100 << 20
    handler = Served()
    head = request("POST", "/completion", "Host: x", f"Content-Length: {size}")
    async with listening(site(handler)) as port:
        answer = await deferToThread(write_then_read, port, head, size)
    (response,) = read_stream(answer, [b"POST"], closed=True)
    assert error_of(response)[0] == "body-too-large" and response.status == 413
    assert handler.admitted == []


@pytest_twisted.ensureDeferred
async def test_a_body_refused_for_its_host_is_read_before_the_403() -> None:
    """Every refusal at the head lingers, not the body cap's alone: Ollama's Host guard, as
    the LAN ones."""
    size = 20 << 20
    handler = Served()
    head = request("POST", "/api/chat", "Host: rebound.example", f"Content-Length: {size}")
    async with listening(FacadeSite(Facade(OLLAMA, handler), size, clock=reactor)) as port:
        answer = await deferToThread(write_then_read, port, head, size)
    (response,) = read_stream(answer, [b"POST"], closed=True)
    assert response.status == 403 and response.value(b"x-nvpair-error") == b"forbidden-host"
    assert handler.admitted == []


# -- the bodies held at once (docs/robustness.md#what-a-request-body-costs) --------------------


class Holding(RequestHandler):
    """The request path's stand-in that answers only when the test says."""

    def __init__(self) -> None:
        self.requests: list[ProxiedRequest] = []
        self.arrived: Deferred[None] = Deferred()

    def handle(self, admitted: Admitted, request: ProxiedRequest) -> Deferred[None]:
        self.requests.append(request)
        if not self.arrived.called:
            self.arrived.callback(None)
        return defer.succeed(None)

    def answer_all(self) -> None:
        for request in self.requests:
            if not request.finished:
                request.respond(ResponseHead(200, fields=Fields.of([(b"Content-Length", b"2")])))
                request.data(b"ok")
                request.end(COMPLETE)


async def eventually(check: Any) -> None:
    for _ in range(int(PATIENCE / 0.05)):
        if check():
            return
        await deferLater(reactor, 0.05, lambda: None)
    raise AssertionError("never held")


@pytest_twisted.ensureDeferred
async def test_bodies_past_max_body_memory_are_503_overloaded_and_nothing_is_left_held() -> None:
    """A declared length is refused at its head; a chunked body the moment it crosses, then
    the connection closes; uploads abandoned half way (a reset) give back what they held."""
    budget = BodyBudget(1 << 20)
    handler = Holding()
    facade_site = FacadeSite(Facade(LLAMACPP, handler), 4 << 20, clock=reactor, bodies=budget)
    body = b'{"p":"' + b"x" * ((600 << 10) - 8) + b'"}'
    async with listening(facade_site) as port:
        held = Raw()
        await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), held)
        assert held.transport is not None
        held.transport.write(post("/completion", body))
        await handler.arrived
        assert budget.held == 600 << 10
        declared = await talk(port, post("/completion", b"x" * (500 << 10)))
        chunked = await talk(
            port,
            request("POST", "/completion", "Host: x", "Transfer-Encoding: chunked")
            + b"".join(b"10000\r\n" + b"x" * 0x10000 + b"\r\n" for _ in range(8))
            + b"0\r\n\r\n",
        )
        for answer in (declared, chunked):
            (response,) = read_stream(answer, [b"POST"], closed=True)
            assert (response.status, error_of(response)[0]) == (503, "overloaded")
            assert response.value(b"retry-after") == b"5"
        assert budget.held == 600 << 10
        # Uploads that stop half way and reset.
        for head, part in [
            (request("POST", "/completion", "Host: x", "Content-Length: 300000"), b"x" * 1000),
            (
                request("POST", "/completion", "Host: x", "Transfer-Encoding: chunked"),
                b"1000\r\n" + b"x" * 0x1000 + b"\r\n",
            ),
        ]:
            with socket.create_connection(("127.0.0.1", port)) as client:
                client.sendall(head + part)
                await eventually(lambda: budget.held > 600 << 10)
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await eventually(lambda: budget.held == 600 << 10)
        handler.answer_all()
        assert budget.held == 0
        # The whole of it is there again.
        whole = Raw()
        await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), whole)
        assert whole.transport is not None
        body = b'{"p":"' + b"x" * ((1 << 20) - 8) + b'"}'
        whole.transport.write(post("/completion", body, "Connection: close"))
        await eventually(lambda: len(handler.requests) == 2)
        assert budget.held == 1 << 20
        handler.answer_all()
        (response,) = read_stream(await whole.done, [b"POST"], closed=True)
        assert response.status == 200 and budget.held == 0
        held.transport.loseConnection()


# -- a client that leaves, and answers without a body ----------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_client_that_leaves_with_requests_queued_is_noticed_and_its_attempt_cancelled(
    tmp_path: Path,
) -> None:
    """Finding 2: reading stopped while a pipelined request waited, so the close went unseen
    and the engine kept generating for nobody."""
    engine = Engine()
    async with proxied(tmp_path, engine) as port:
        raw = Raw()
        await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), raw)
        assert raw.transport is not None
        raw.transport.write(
            post("/completion", b'{"prompt":"one"}') + post("/completion", b'{"prompt":"two"}')
        )
        await engine.first.addTimeout(PATIENCE, reactor)
        raw.transport.loseConnection()
        await engine.cancelled.addTimeout(PATIENCE, reactor)
        # Anything still queued would have gone out before this answer on a new connection.
        after = await talk(port, request("GET", "/health", "Host: x", "Connection: close"))
    assert read_stream(after, [b"GET"], closed=True)[0].status == 200
    assert engine.seen == [(b"POST", b"/completion"), (b"GET", b"/health")]


@pytest_twisted.ensureDeferred
async def test_204_and_304_carry_no_content_length_to_head_or_get() -> None:
    """RFC 9110 §8.6: a 204 to HEAD kept the engine's Content-Length."""
    async with listening(site(Served())) as port:
        answer = await talk(
            port,
            request("HEAD", "/nothing", "Host: x")
            + request("GET", "/nothing", "Host: x")
            + request("HEAD", "/cached", "Host: x")
            + request("GET", "/cached", "Host: x", "Connection: close"),
        )
    responses = read_stream(answer, [b"HEAD", b"GET", b"HEAD", b"GET"], closed=True)
    assert [r.status for r in responses] == [204, 204, 304, 304]
    assert [r.values(b"content-length") for r in responses] == [[], [], [], []]
