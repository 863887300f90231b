"""Refusals decided at the request head, request targets, and the head and idle timeouts.

Each request is fed to the real facade channel over an in-memory transport; the body a
refused request declares is sent only after the answer is checked, so an answer that waited
for it would not be there.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from twisted.internet import defer
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from nvpair.engines.table import LLAMACPP, LMSTUDIO, OLLAMA, Engine
from nvpair.facades.facade import Admitted, Facade, RequestHandler
from nvpair.wire.message import COMPLETE, Fields, ResponseHead
from nvpair.wire.server.channel import FacadeChannel
from nvpair.wire.server.reader import LINGER_SECONDS
from nvpair.wire.server.site import FacadeSite
from nvpair.wire.web import ProxiedRequest

LOOPBACK = IPv4Address("TCP", "127.0.0.1", 40000)


class Recorder(RequestHandler):
    def __init__(self) -> None:
        self.seen: list[Admitted] = []

    def handle(self, admitted: Admitted, request: ProxiedRequest) -> Deferred[None]:
        self.seen.append(admitted)
        request.respond(ResponseHead(200, fields=Fields.of([(b"Content-Length", b"2")])))
        request.data(b"ok")
        request.end(COMPLETE)
        return defer.succeed(None)


class Connection:
    def __init__(
        self,
        engine: Engine,
        peer: Any = LOOPBACK,
        max_body: int = 1000,
        head_timeout: float = 30.0,
        idle_timeout: float = 300.0,
    ) -> None:
        self.clock = Clock()
        self.handler = Recorder()
        site = FacadeSite(
            Facade(engine, self.handler),
            max_body,
            head_timeout=head_timeout,
            idle_timeout=idle_timeout,
            clock=self.clock,
        )
        protocol = site.buildProtocol(peer)
        assert isinstance(protocol, FacadeChannel)
        self.protocol = protocol
        self.transport = StringTransport(peerAddress=peer)
        protocol.makeConnection(self.transport)

    def send(self, data: bytes) -> None:
        self.protocol.dataReceived(data)

    def closed(self) -> bool:
        return bool(self.transport.disconnecting or self.transport.disconnected)

    def answer(self) -> tuple[str, dict[str, str], bytes]:
        head, _, body = self.transport.value().partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        return lines[0], headers, body


def head(method: str, target: str, host: str = "localhost", extra: str = "") -> bytes:
    return f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode()


def test_non_loopback_is_answered_403_before_the_body_arrives() -> None:
    conn = Connection(OLLAMA, peer=IPv6Address("TCP", "::ffff:192.168.1.9", 5000))
    conn.send(head("POST", "/api/chat", extra="Content-Length: 50000000\r\n"))
    status, headers, body = conn.answer()
    assert status == "HTTP/1.1 403 Forbidden" and headers["x-nvpair-error"] == "forbidden"
    assert headers["connection"] == "close" and json.loads(body)["error"]
    assert conn.handler.seen == []
    # The body it declared never comes: the lingering bound closes the connection.
    conn.clock.advance(LINGER_SECONDS)
    assert conn.closed()


def test_declared_body_over_the_cap_is_413_at_the_head_and_closed() -> None:
    conn = Connection(LLAMACPP, max_body=1000)
    conn.send(head("POST", "/completion", extra="Content-Length: 1001\r\n"))
    status, headers, body = conn.answer()
    assert status.startswith("HTTP/1.1 413") and headers["x-nvpair-error"] == "body-too-large"
    assert int(headers["content-length"]) == len(body)
    assert json.loads(body)["error"]["code"] == "body-too-large"
    assert not conn.closed()
    # What the client sends next is read and dropped, never handled; then the close.
    conn.send(b"x" * 1001 + head("GET", "/models"))
    assert conn.handler.seen == [] and conn.closed()


def test_expect_100_continue_gets_no_interim_answer_when_refused() -> None:
    conn = Connection(LLAMACPP, max_body=10)
    conn.send(head("POST", "/completion", extra="Content-Length: 11\r\nExpect: 100-continue\r\n"))
    assert b"100 Continue" not in conn.transport.value()
    assert conn.answer()[0].startswith("HTTP/1.1 413")


def test_chunked_body_is_refused_the_moment_it_crosses_the_cap() -> None:
    conn = Connection(LLAMACPP, max_body=1000)
    conn.send(head("POST", "/completion", extra="Transfer-Encoding: chunked\r\n"))
    conn.send(b"258\r\n" + b"x" * 600 + b"\r\n")
    assert conn.transport.value() == b"" and not conn.closed()
    conn.send(b"258\r\n" + b"x" * 600 + b"\r\n")
    status, headers, _ = conn.answer()
    assert status.startswith("HTTP/1.1 413") and headers["x-nvpair-error"] == "body-too-large"
    assert not conn.closed()
    conn.send(b"1\r\nx\r\n0\r\n\r\n")
    assert conn.closed() and conn.handler.seen == []


@pytest.mark.parametrize("target", ["*", "example.com:443", "api/chat", "ftp://x/y", "http:///x"])
def test_a_target_in_neither_form_is_400_bad_request(target: str) -> None:
    conn = Connection(LLAMACPP)
    conn.send(head("POST", target, extra="Content-Length: 2\r\n") + b"{}")
    status, headers, body = conn.answer()
    assert status.startswith("HTTP/1.1 400") and headers["x-nvpair-error"] == "bad-request"
    assert json.loads(body)["error"]["code"] == "bad-request"
    assert conn.closed() and conn.handler.seen == []


def test_absolute_form_is_routed_by_its_path_and_query() -> None:
    conn = Connection(OLLAMA)
    body = b'{"model":"m"}'
    conn.send(
        head(
            "POST",
            "http://127.0.0.1:11435/api/chat?x=1",
            extra=f"Content-Length: {len(body)}\r\n",
        )
        + body
    )
    assert conn.answer()[0] == "HTTP/1.1 200 OK"
    (admitted,) = conn.handler.seen
    assert admitted.path == "/api/chat" and admitted.uri == b"/api/chat?x=1"
    assert admitted.model == "m"


def test_head_refusal_has_no_body_but_the_real_length() -> None:
    conn = Connection(OLLAMA, peer=IPv4Address("TCP", "10.1.2.3", 5000))
    conn.send(head("HEAD", "/api/tags"))
    status, headers, body = conn.answer()
    assert status.startswith("HTTP/1.1 403") and body == b""
    assert int(headers["content-length"]) > 0


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:11434", "attacker.com", "8.8.8.8", "[2001:db8::1]:1"]
)
def test_ollama_refuses_a_rebound_host(host: str) -> None:
    conn = Connection(OLLAMA)
    conn.send(head("GET", "/api/tags", host=host))
    status, headers, body = conn.answer()
    assert status.startswith("HTTP/1.1 403") and headers["x-nvpair-error"] == "forbidden-host"
    assert json.loads(body) == {"error": "this Host is not allowed (DNS-rebinding guard)"}
    assert conn.handler.seen == []


def test_ollama_host_of_an_absolute_target_is_the_one_checked() -> None:
    conn = Connection(OLLAMA)
    conn.send(head("GET", "http://evil.example/api/tags", host="localhost"))
    assert conn.answer()[1]["x-nvpair-error"] == "forbidden-host"


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "localhost:11434",
        "127.0.0.1:11435",
        "[::1]:11434",
        "0.0.0.0",
        "192.168.1.20:11434",
        "10.0.0.5",
        "gpu.local",
        "x.internal:8",
        "app.localhost",
        "",
    ],
)
def test_ollama_allows_local_hosts(host: str) -> None:
    conn = Connection(OLLAMA)
    conn.send(head("GET", "/api/version", host=host))
    assert conn.answer()[0] == "HTTP/1.1 200 OK"


def test_other_engines_do_not_check_host() -> None:
    conn = Connection(LMSTUDIO)
    conn.send(head("GET", "/v1/models", host="evil.example"))
    assert conn.answer()[0] == "HTTP/1.1 200 OK"


def test_a_head_trickled_past_the_head_timeout_is_closed() -> None:
    """Every byte resets the idle timer; the head timer runs from the first byte regardless."""
    conn = Connection(LLAMACPP, head_timeout=30, idle_timeout=300)
    for byte in b"GET /models HTTP/1.1\r\nHost: x\r\n":
        conn.send(bytes([byte]))
        conn.clock.advance(1)
        if conn.closed():
            break
    assert conn.closed() and conn.transport.value() == b""


def test_a_head_completed_in_time_is_served_and_the_timer_disarmed() -> None:
    conn = Connection(LLAMACPP, head_timeout=30, idle_timeout=300)
    conn.send(b"GET /models HTTP/1.1\r\n")
    conn.clock.advance(29)
    conn.send(b"Host: x\r\n\r\n")
    assert conn.answer()[0] == "HTTP/1.1 200 OK"
    conn.clock.advance(100)
    assert not conn.closed()


def test_the_next_heads_timer_starts_at_its_own_first_byte() -> None:
    conn = Connection(LLAMACPP, head_timeout=30, idle_timeout=300)
    conn.send(head("GET", "/models"))
    conn.clock.advance(200)  # kept alive, idle: the head timer is not running
    assert not conn.closed()
    conn.send(b"GET /models HT")
    conn.clock.advance(29)
    assert not conn.closed()
    conn.clock.advance(2)
    assert conn.closed()


def test_an_idle_kept_alive_connection_is_closed_after_the_idle_timeout() -> None:
    conn = Connection(LLAMACPP, head_timeout=30, idle_timeout=300)
    conn.send(head("GET", "/models"))
    conn.clock.advance(299)
    assert not conn.closed()
    conn.clock.advance(2)
    assert conn.closed()


def test_a_body_is_not_bounded_by_the_head_timeout() -> None:
    conn = Connection(LLAMACPP, head_timeout=30, idle_timeout=300)
    conn.send(head("POST", "/completion", extra="Content-Length: 2\r\n"))
    conn.clock.advance(40)
    conn.send(b"{}")
    assert conn.answer()[0] == "HTTP/1.1 200 OK"


def test_a_head_line_past_the_line_limit_is_400_bad_request_not_a_silent_close() -> None:
    conn = Connection(LLAMACPP)
    conn.send(b"GET /models HTTP/1.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
    status, headers, _ = conn.answer()
    assert status.startswith("HTTP/1.1 400") and headers["x-nvpair-error"] == "bad-request"
    assert conn.closed()


def test_a_head_llhttp_cannot_parse_says_why() -> None:
    conn = Connection(OLLAMA)
    conn.send(b"GET /api/tags HTTP/1.1\r\nHost localhost\r\n\r\n")
    status, headers, body = conn.answer()
    assert status.startswith("HTTP/1.1 400") and headers["x-nvpair-error"] == "bad-request"
    assert json.loads(body) == {"error": "malformed request: Invalid header token"}


def test_two_host_headers_are_400_bad_request() -> None:
    conn = Connection(OLLAMA)
    conn.send(b"GET /api/tags HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n")
    status, headers, _ = conn.answer()
    assert status.startswith("HTTP/1.1 400") and headers["x-nvpair-error"] == "bad-request"
    assert conn.handler.seen == []


def test_bytes_after_a_refusal_are_not_parsed_or_answered() -> None:
    """A socket stops reading once a refusal closes it; data already in flight is dropped."""
    conn = Connection(LLAMACPP, max_body=10)
    conn.send(head("POST", "/completion", extra="Content-Length: 11\r\n"))
    answered = conn.transport.value()
    conn.send(b"GET /a b HTTP/1.1\r\nX\r\n\r\n" + b"X-Big: " + b"a" * 20000 + b"\r\n\r\n")
    assert conn.transport.value() == answered and conn.closed()


def test_an_idle_client_that_reads_nothing_is_aborted_after_the_grace() -> None:
    """The idle close is graceful; a peer that never drains the last answer is still cut off."""
    conn = Connection(LLAMACPP, head_timeout=30, idle_timeout=300)
    conn.send(head("GET", "/models"))
    aborts: list[bool] = []
    conn.transport.abortConnection = lambda: aborts.append(True)  # type: ignore[method-assign]
    conn.clock.advance(301)
    assert conn.closed() and aborts == []  # graceful first
    conn.clock.advance(conn.protocol.abortTimeout + 1)
    assert aborts == [True]


class BrokenGate(Facade):
    def refusal_at_head(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug in the gate")


def test_a_bug_while_reading_a_head_is_500_internal_for_that_connection_only() -> None:
    clock = Clock()
    site = FacadeSite(BrokenGate(LLAMACPP, Recorder()), 1000, clock=clock)
    protocol = site.buildProtocol(LOOPBACK)
    transport = StringTransport(peerAddress=LOOPBACK)
    protocol.makeConnection(transport)
    protocol.dataReceived(head("GET", "/models"))
    assert transport.value().startswith(b"HTTP/1.1 500 ")
    assert b"X-Nvpair-Error: internal" in transport.value() and transport.disconnecting


def test_a_head_request_llhttp_stops_in_gets_its_refusal_without_a_body() -> None:
    """llhttp knows the method before the target it stopped at: a HEAD's answer has no body."""
    conn = Connection(LLAMACPP)
    conn.send(b"HEAD ! HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = conn.answer()
    assert status.startswith("HTTP/1.1 400") and int(headers["content-length"]) > 0
    assert body == b"" and conn.closed()
