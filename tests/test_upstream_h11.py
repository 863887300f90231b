# -*- test-case-name: tests.test_upstream_h11 -*-
"""The upstream client against h11 as oracle: any answer an engine may send, cut into reads
anywhere, reads the same through :class:`~nvpair.upstream_conn.UpstreamConnection` as through
h11's client — refused by both (a transfer coding nobody offered), or the same status,
end-to-end fields, body bytes, whether it ended whole, and whether the connection may carry
another request.

Where RFC 9112 leaves a recipient the choice (two equal ``Content-Length`` fields, obsolete
line folding) this client refuses what h11 accepts, h11 keeps no HTTP/1.0 connection alive,
and it refuses a transfer coding even on a HEAD answer, whose body is none;
``tests/test_upstream_rfc9112.py`` holds those cases.
"""

from __future__ import annotations

import itertools

import h11
from attrs import frozen
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.error import ConnectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseNeverReceived
from twisted.web.http import PotentialDataLoss

from tests.test_bodies import result_of
from tests.test_upstream_conn import Rig, read

#: Field names no framing or hop-by-hop rule touches.
NAMES = st.from_regex(rb"\AX-[A-Za-z0-9-]{1,10}\Z")
#: Values as a sender writes them: visible characters, no whitespace at either end.
VALUES = st.from_regex(rb"\A([!-~]([ !-~]{0,20}[!-~])?)?\Z")
REASONS = {200: b"OK", 204: b"No Content", 304: b"Not Modified", 404: b"Not Found"}


@frozen
class Exchange:
    method: bytes
    wire: bytes
    #: The engine closes the connection after ``wire``.
    eof: bool
    #: Where the reads split ``wire``.
    cuts: tuple[int, ...]


@frozen
class Seen:
    refused: bool
    status: int
    fields: dict[bytes, list[bytes]]
    body: bytes
    whole: bool
    reusable: bool


def chunked(body: bytes, cuts: list[int], extension: bytes, trailers: list[bytes]) -> bytes:
    edges = [0, *sorted({c % (len(body) + 1) for c in cuts}), len(body)]
    pieces = [body[a:b] for a, b in itertools.pairwise(edges) if b > a]
    framed = b"".join(b"%x%s\r\n%s\r\n" % (len(p), extension, p) for p in pieces)
    return framed + b"0\r\n" + b"".join(t + b"\r\n" for t in trailers) + b"\r\n"


@st.composite
def exchanges(draw: st.DrawFn) -> Exchange:
    method = draw(st.sampled_from([b"GET", b"HEAD", b"POST"]))
    http10 = draw(st.booleans())
    status = draw(st.sampled_from([200, 201, 204, 304, 404, 429, 500, 503]))
    bodiless = method == b"HEAD" or status in (204, 304)
    framings = ["length", "close"] if http10 else ["length", "close", "chunked"]
    framing = draw(st.sampled_from(framings + ([] if bodiless else ["coded"])))
    body = draw(st.binary(max_size=120))
    fields = draw(st.lists(st.tuples(NAMES, VALUES), max_size=4))
    head = b""
    if not http10:
        for code in draw(st.lists(st.sampled_from([100, 103]), max_size=2)):
            head += b"HTTP/1.1 %d Interim\r\nLink: </a>\r\n\r\n" % code
    head += b"HTTP/1.%d %d %s\r\n" % (0 if http10 else 1, status, REASONS.get(status, b"X"))
    head += b"".join(name + b": " + value + b"\r\n" for name, value in fields)
    if not http10 and draw(st.booleans()):
        head += b"Connection: close\r\n"
    if framing == "length":
        head += b"Content-Length: %d\r\n" % len(body)
    elif framing == "chunked":
        head += b"Transfer-Encoding: chunked\r\n"
    elif framing == "coded":
        codings = [b"gzip, chunked", b"chunked, gzip", b"identity", b"deflate"]
        head += b"Transfer-Encoding: " + draw(st.sampled_from(codings)) + b"\r\n"
    head += b"\r\n"
    if bodiless:
        content = b""
    elif framing == "chunked":
        extension = draw(st.sampled_from([b"", b";a=b", b';n="v w"']))
        trailers = draw(st.lists(st.sampled_from([b"X-Sum: 1", b"X-End: done"]), max_size=2))
        cuts = draw(st.lists(st.integers(0, 200), max_size=4))
        content = chunked(body, cuts, extension, trailers)
    else:
        content = body
    wire = head + content
    cuts = draw(st.lists(st.integers(1, max(len(wire) - 1, 1)), max_size=6))
    eof = framing in ("close", "coded") and not bodiless
    return Exchange(method, wire, eof, tuple(sorted(set(cuts))))


def segments(exchange: Exchange) -> list[bytes]:
    edges = [0, *exchange.cuts, len(exchange.wire)]
    return [exchange.wire[a:b] for a, b in itertools.pairwise(edges) if b > a]


_FRAMING = {b"connection", b"content-length", b"transfer-encoding"}


def through_h11(exchange: Exchange) -> Seen:
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method=exchange.method, target="/", headers=[("Host", "h")]))
    client.send(h11.EndOfMessage())
    for segment in segments(exchange):
        client.receive_data(segment)
    if exchange.eof:
        client.receive_data(b"")
    try:
        return _events(client)
    except h11.RemoteProtocolError:
        return REFUSED


REFUSED = Seen(True, 0, {}, b"", False, False)


def _events(client: h11.Connection) -> Seen:
    status, fields, body, whole = 0, dict[bytes, list[bytes]](), b"", False
    while (event := client.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
        if isinstance(event, h11.Response):
            status = event.status_code
            for name, value in event.headers:
                if name not in _FRAMING:
                    fields.setdefault(name, []).append(value)
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            whole = True
        elif isinstance(event, h11.ConnectionClosed):
            break
    reusable = client.our_state is h11.DONE and client.their_state is h11.DONE
    return Seen(False, status, fields, body, whole, reusable)


def through_the_client(exchange: Exchange) -> Seen:
    rig = Rig()
    d = rig.send(exchange.method)
    rig.feed(*segments(exchange))
    response = result_of(d)
    if isinstance(response, Failure):
        assert response.check(ResponseNeverReceived) and rig.closing
        return REFUSED
    reader = read(response)
    if exchange.eof:
        rig.lose(ConnectionDone())
    fields = {
        name.lower(): list(values)
        for name, values in response.headers.getAllRawHeaders()
        if name.lower() not in _FRAMING
    }
    whole = reader.ended_with(ResponseDone) or reader.ended_with(PotentialDataLoss)
    return Seen(False, response.code, fields, reader.body, whole, rig.reused)


@settings(max_examples=400)
@given(exchanges())
def test_every_well_formed_answer_reads_as_h11_reads_it(exchange: Exchange) -> None:
    assert through_the_client(exchange) == through_h11(exchange)
