"""The facade reads a request as h11 does: h11, a pure-Python HTTP/1.1 parser that follows RFC
9112 to the letter, is the oracle.

Each example is one request, generated from RFC 9112's grammar with some of what a server must
refuse (no ``Host``, two, a transfer coding other than chunked), cut at arbitrary points and fed
to the real facade connection. h11 reads the same bytes. Where h11 accepts the request, the
facade hands on exactly what h11 read (method, target, header fields, body) and no trailer field;
where h11 refuses it, the facade answers a refusal and hands on nothing. One place RFC 9112
asks more than h11 checks: an HTTP/1.0 request with ``Transfer-Encoding`` (§6.1: its framing
is faulty), which the facade refuses, as nginx does.
"""

from __future__ import annotations

import os
from typing import Any

import h11
from attrs import frozen
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from nvpair.engines import LLAMACPP
from nvpair.facade_server import FacadeSite
from nvpair.http_facade import Admitted, Facade, RequestHandler
from tests.httpwire import read_stream

EXAMPLES = int(os.environ.get("NVPAIR_FUZZ_EXAMPLES", "300"))
LOOPBACK = IPv4Address("TCP", "127.0.0.1", 40000)

#: Methods llhttp and h11 both carry; llhttp knows no others (those are 501, tested elsewhere).
METHODS = [b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"PROPFIND"]
#: Targets on llama.cpp's "other" routes: forwarded whatever their body holds.
TARGETS = [b"/props", b"/tokenize", b"/slots?fields=id", b"/a/b%20c", b"http://localhost/props"]
TOKEN = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.!~", min_size=1)
VALUE = st.text("".join(chr(c) for c in range(0x21, 0x7F)), max_size=20)


@frozen
class Seen:
    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes


class Recorder(RequestHandler):
    def __init__(self) -> None:
        self.seen: list[Seen] = []

    def handle(self, admitted: Admitted, request: Any) -> Deferred[None]:
        fields = [
            (name.lower(), value)
            for name, values in request.requestHeaders.getAllRawHeaders()
            for value in values
        ]
        self.seen.append(Seen(admitted.method, admitted.uri, fields, admitted.body))
        request.setResponseCode(200)
        request.setHeader(b"content-length", b"0")
        request.finish()
        return defer.succeed(None)


@frozen
class Drawn:
    """A request as sent, and whether RFC 9112 refuses it where h11 reads it."""

    data: bytes
    stricter_than_h11: bool


@st.composite
def requests(draw: st.DrawFn) -> Drawn:
    method = draw(st.sampled_from(METHODS))
    target = draw(st.sampled_from(TARGETS))
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.0"]))
    fields = [
        (name.encode(), draw(st.sampled_from([b"", b" ", b"\t"])) + value.encode())
        for name, value in draw(st.lists(st.tuples(TOKEN, VALUE), max_size=4))
        # Framing and hosts are drawn below; hop-by-hop ones would change the connection.
        if name.lower() not in ("host", "content-length", "transfer-encoding", "connection")
        and not name.lower().startswith(("upgrade", "expect", "te"))
    ]
    connection = draw(
        st.sampled_from([b"", b"close", b"Upgrade, HTTP2-Settings", b"upgrade, close"])
    )
    if connection:
        fields.append((b"Connection", connection))
    if b"pgrade" in connection:
        # An upgrade offer, which both ignore (h11 reads the request, then waits for an answer).
        fields.append((b"Upgrade", draw(st.sampled_from([b"h2c", b"websocket"]))))
    hosts = draw(st.sampled_from([0, 1, 1, 1, 2]))
    fields += [(b"Host", b"localhost:%d" % n) for n in range(hosts)]
    body = b""
    framing = draw(st.sampled_from(["none", "length", "chunked", "chunked", "other-coding"]))
    if framing == "length":
        content = draw(st.binary(max_size=64))
        fields.append((b"Content-Length", b"%d" % len(content)))
        body = content
    elif framing in ("chunked", "other-coding"):
        coding = b"chunked" if framing == "chunked" else draw(st.sampled_from([b"gzip, chunked"]))
        fields.append((b"Transfer-Encoding", coding))
        chunks = draw(st.lists(st.binary(min_size=1, max_size=16), max_size=4))
        extension = draw(st.sampled_from([b"", b";ext=1"]))
        trailers = draw(st.lists(st.tuples(TOKEN, VALUE), max_size=2))
        body = b"".join(b"%x%s\r\n%s\r\n" % (len(c), extension, c) for c in chunks)
        body += b"0\r\n" + b"".join(b"%s: %s\r\n" % (n.encode(), v.encode()) for n, v in trailers)
        body += b"\r\n"
    draw(st.randoms()).shuffle(fields)
    head = b"%s %s HTTP/%s\r\n" % (method, target, version)
    head += b"".join(b"%s:%s\r\n" % field for field in fields)
    coded_1_0 = version == b"1.0" and framing in ("chunked", "other-coding")
    return Drawn(head + b"\r\n" + body, stricter_than_h11=coded_1_0)


def h11_reading(data: bytes) -> Seen | None:
    """What h11 reads of ``data``: the request, or None when it refuses it."""
    connection = h11.Connection(h11.SERVER)
    connection.receive_data(data)
    request: h11.Request | None = None
    body = b""
    try:
        while True:
            event = connection.next_event()
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                raise AssertionError(f"h11 stopped at {event!r}: the example is incomplete")
    except h11.RemoteProtocolError:
        return None
    assert request is not None
    fields = [(bytes(name), bytes(value)) for name, value in request.headers]
    return Seen(request.method, request.target, fields, body)


def facade_reading(pieces: list[bytes]) -> tuple[Recorder, bytes]:
    recorder = Recorder()
    site = FacadeSite(Facade(LLAMACPP, recorder), 1 << 20, clock=Clock())
    protocol = site.buildProtocol(LOOPBACK)
    transport = StringTransport(peerAddress=LOOPBACK)
    protocol.makeConnection(transport)
    for piece in pieces:
        protocol.dataReceived(piece)
    return recorder, transport.value()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(drawn=requests(), cuts=st.lists(st.integers(min_value=1, max_value=4096), max_size=5))
def test_the_facade_reads_a_request_as_h11_does(drawn: Drawn, cuts: list[int]) -> None:
    data = drawn.data
    points = sorted({c % len(data) for c in cuts} - {0})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    recorder, written = facade_reading(pieces)
    expected = None if drawn.stricter_than_h11 else h11_reading(data)
    event("h11 refuses" if expected is None else "h11 accepts")
    if expected is None:
        assert recorder.seen == []
        (answer,) = read_stream(written, [None], closed=False)
        assert answer.status in (400, 501), answer
        return
    (seen,) = recorder.seen
    # An absolute-form target reaches the request path in origin form.
    target = expected.target.removeprefix(b"http://localhost")
    assert (seen.method, seen.target, seen.body) == (expected.method, target, expected.body)
    # h11 lowercases names and keeps the order; twisted's Headers groups by name.
    assert sorted(seen.headers) == sorted(expected.headers)
