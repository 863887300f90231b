"""Response framing and hop-by-hop headers, byte for byte, through real sockets.

A real facade (FacadeSite + RequestPath + Upstream) in front of a tiny twisted.web engine on
loopback; the client is a raw TCP connection so the exact header bytes are visible.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import reactor as _reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.web.resource import Resource
from twisted.web.server import Site

from nvpair.engines.table import LLAMACPP
from nvpair.facades.facade import Facade
from nvpair.wire.server.site import FacadeSite
from tests.httpwire import Raw
from tests.onenode import one_node_path

#: The global reactor, untyped: its listen*/connect* generics reject a Site.
reactor: Any = _reactor


class Engine(Resource):
    isLeaf = True

    def render(self, request: Any) -> bytes:
        path = request.path
        if path == b"/props":
            # A HEAD answer describes the GET body: 20 bytes.
            request.setHeader(b"content-type", b"application/json")
            request.setHeader(b"content-length", b"20")
            return b"" if request.method == b"HEAD" else b'{"n_ctx":4096,"x":1}'
        if path == b"/nothing":
            request.setResponseCode(204)
            return b""
        if path == b"/hop":
            request.setHeader(b"connection", b"x-hop, keep-alive")
            request.setHeader(b"x-hop", b"secret-of-this-hop")
            request.setHeader(b"x-end", b"kept")
            return b"{}"
        request.setResponseCode(404)
        return b"{}"


@contextlib.asynccontextmanager
async def facade(tmp_path: Path) -> AsyncIterator[int]:
    engine = reactor.listenTCP(0, Site(Engine()), interface="127.0.0.1")
    events: list[object] = []
    path, upstream = one_node_path(
        tmp_path, f"http://127.0.0.1:{engine.getHost().port}", lambda m, p: events.append(m)
    )
    listener = reactor.listenTCP(
        0, FacadeSite(Facade(LLAMACPP, path), 1 << 20, clock=reactor), interface="127.0.0.1"
    )
    try:
        yield listener.getHost().port
    finally:
        await upstream.close()
        await listener.stopListening()
        await engine.stopListening()


async def exchange(port: int, head: bytes) -> tuple[str, dict[bytes, bytes], bytes]:
    raw = Raw()
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
    protocol = await connectProtocol(endpoint, raw)
    protocol.transport.write(head)
    data = await raw.done
    head_bytes, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head_bytes.split(b"\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return status.decode(), headers, body


def request(method: str, path: str) -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()


@pytest_twisted.ensureDeferred
async def test_head_keeps_the_engines_content_length(tmp_path: Path) -> None:
    async with facade(tmp_path) as port:
        status, headers, body = await exchange(port, request("HEAD", "/props"))
    assert status == "HTTP/1.1 200 OK"
    assert headers[b"content-length"] == b"20" and body == b""
    assert headers[b"x-nvpair-node"] == b"gpu-1"


@pytest_twisted.ensureDeferred
async def test_204_carries_no_content_length(tmp_path: Path) -> None:
    async with facade(tmp_path) as port:
        status, headers, body = await exchange(port, request("GET", "/nothing"))
    assert status.startswith("HTTP/1.1 204")
    assert b"content-length" not in headers and b"transfer-encoding" not in headers
    assert body == b""


@pytest_twisted.ensureDeferred
async def test_headers_named_by_the_upstream_connection_header_stay_behind(
    tmp_path: Path,
) -> None:
    async with facade(tmp_path) as port:
        status, headers, _ = await exchange(port, request("GET", "/hop"))
    assert status == "HTTP/1.1 200 OK"
    assert b"x-hop" not in headers and headers[b"x-end"] == b"kept"
    assert headers[b"connection"] == b"close"


@pytest_twisted.ensureDeferred
async def test_a_get_keeps_length_framing(tmp_path: Path) -> None:
    async with facade(tmp_path) as port:
        _, headers, body = await exchange(port, request("GET", "/props"))
    assert headers[b"content-length"] == b"20" and len(body) == 20
