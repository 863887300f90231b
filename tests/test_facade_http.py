"""A facade over an in-memory HTTP connection: containment, body cap, loopback gate."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet import defer
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.defer import Deferred
from twisted.internet.testing import StringTransport

from nvpair.engines.table import LLAMACPP, OLLAMA, Engine
from nvpair.facades.facade import Admitted, Facade, RequestHandler
from nvpair.wire.message import COMPLETE, ResponseHead
from nvpair.wire.server.site import FacadeSite
from nvpair.wire.web import ProxiedRequest


class Broken(RequestHandler):
    def __init__(self) -> None:
        self.seen: list[Admitted] = []

    def handle(self, admitted: Admitted, request: ProxiedRequest) -> Deferred[None]:
        self.seen.append(admitted)
        if admitted.path == "/boom":
            return defer.fail(ZeroDivisionError("a bug"))
        request.respond(ResponseHead(200))
        request.data(b"fine")
        request.end(COMPLETE)
        return defer.succeed(None)


def exchange(
    engine: Engine,
    raw: bytes,
    handler: RequestHandler | None = None,
    peer: Any = None,
    max_body: int = 1000,
) -> bytes:
    site = FacadeSite(Facade(engine, handler or Broken()), max_body)
    peer = peer or IPv4Address("TCP", "127.0.0.1", 40000)
    protocol = site.buildProtocol(peer)
    assert protocol is not None
    transport = StringTransport(peerAddress=peer)
    protocol.makeConnection(transport)
    protocol.dataReceived(raw)
    answer: bytes = transport.value()
    return answer


def post(path: str, body: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def split(answer: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return lines[0], headers, body


def test_a_bug_handling_one_request_answers_500_internal_and_nothing_else() -> None:
    handler = Broken()
    answer = exchange(LLAMACPP, post("/boom", b"{}") + post("/completion", b"{}"), handler)
    first, second = answer.split(b"HTTP/1.1 ")[1:]
    status, headers, body = split(b"HTTP/1.1 " + first)
    assert status.startswith("HTTP/1.1 500") and headers["x-nvpair-error"] == "internal"
    assert json.loads(body)["error"]["code"] == "internal"
    # The same connection goes on serving the next request.
    assert second.startswith(b"200") and b"\r\nfine\r\n" in second


def test_body_over_the_cap_is_413_and_never_handled() -> None:
    handler = Broken()
    answer = exchange(OLLAMA, post("/api/chat", b"x" * 1001), handler)
    status, headers, body = split(answer)
    assert "413" in status and headers["x-nvpair-error"] == "body-too-large"
    assert json.loads(body) == {"error": "the request body is too large"}
    assert handler.seen == []


def test_chunked_body_over_the_cap_is_413() -> None:
    handler = Broken()
    chunk = b"x" * 600
    raw = (
        b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n" % len(chunk)
        + chunk
        + b"\r\n"
        + b"%x\r\n" % len(chunk)
        + chunk
        + b"\r\n0\r\n\r\n"
    )
    status, _, _ = split(exchange(OLLAMA, raw, handler))
    assert "413" in status and handler.seen == []


def test_plaintext_from_a_non_loopback_peer_is_403_forbidden() -> None:
    handler = Broken()
    peer = IPv6Address("TCP", "::ffff:192.168.1.9", 5000)
    status, headers, _ = split(exchange(OLLAMA, post("/api/chat", b"{}"), handler, peer))
    assert "403" in status and headers["x-nvpair-error"] == "forbidden"
    assert not any(name.startswith("access-control-") for name in headers)
    assert handler.seen == []


def test_v4_mapped_loopback_peer_is_served() -> None:
    handler = Broken()
    peer = IPv6Address("TCP", "::ffff:127.0.0.1", 5000)
    status, _, _ = split(exchange(LLAMACPP, post("/completion", b"{}"), handler, peer))
    assert "200" in status and len(handler.seen) == 1


def test_form_bodies_are_forwarded_not_parsed() -> None:
    """Uploads go to the engine as they are: nothing parses a form or multipart body."""
    handler = Broken()
    body = b"a=1&b=2"
    raw = (
        b"POST /tokenize HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n"
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )
    status, _, _ = split(exchange(LLAMACPP, raw, handler))
    assert "200" in status and handler.seen[0].body == body
