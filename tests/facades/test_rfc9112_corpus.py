"""RFC 9112 cases, byte for byte, through a real listener.

Each request row is written by a raw socket client to a facade listening on 127.0.0.1 (the
FacadeManager's listener, so the first-byte sniffer and the whole request path run) in front of
a loopback engine stand-in that records what it was sent and answers ``200 ok``. Each response
row is the other way round: the engine stand-in writes the row's bytes (then closes) to a plain
``GET /props``, and the client checks what the facade relayed.

Expected verdicts are the docs' and RFC 9112's, and where the RFC leaves a choice the row
holds the one made (docs/robustness.md). The ``nginx`` column says what nginx 1.22 answered to
the same bytes (as a reverse proxy on loopback in front of the same kind of stand-in); it is a
record, not run here. Where the verdict parts from h11's on purpose:
docs/robustness.md#where-we-differ-from-h11.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from attrs import field, frozen
from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.threads import deferToThread

from nvpair.facades.manager import FacadeManager
from nvpair.wire.server.body_budget import BodyBudget
from tests.httpwire import Malformed, WireResponse, read_stream
from tests.integration.harness import free_port
from tests.onenode import one_node_path

#: The global reactor, untyped: its listen*/connect* generics reject a Factory.
reactor: Any = _reactor

#: The facade's body cap in these rows: small, so the cap has rows of its own.
MAX_BODY = 1024
#: How long a row's client waits for what it expects before it gives up.
PATIENCE = 2.0

ENGINE_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


# -- the rows -------------------------------------------------------------------------------------


@frozen
class Expect:
    """What the client must get, and (for a request row) what the engine must be sent.

    :ivar status: the last answer's status (a set: any of them).
    :ivar reason: its ``X-Nvpair-Error``; None: relayed from the engine (no such header).
    :ivar mentions: words its error message must hold (the 400 names what was wrong).
    :ivar body: its body, when it matters.
    :ivar answers: how many final answers the client gets.
    :ivar closed: the proxy closes the connection after the answers.
    :ivar cut: the last answer is cut short (the connection closed before its framing ended).
    :ivar sent: what the engine must be sent, one ``(method, target, body)`` per request.
    :ivar fields: fields the engine must be sent with these values (None: must not be sent).
    :ivar answer_fields: fields the client's answer must carry (None: must not carry).
    :ivar version: the answer's HTTP version.
    """

    status: frozenset[int]
    reason: str | None = None
    mentions: tuple[str, ...] = ()
    body: bytes | None = None
    answers: int = 1
    closed: bool | None = None
    cut: bool = False
    sent: tuple[tuple[bytes, bytes, bytes], ...] | None = None
    fields: Mapping[bytes, bytes | None] = field(factory=dict)
    answer_fields: Mapping[bytes, bytes | None] = field(factory=dict)
    version: bytes = b"HTTP/1.1"


def served(*sent: tuple[bytes, bytes, bytes], body: bytes = b"ok", **more: Any) -> Expect:
    """Forwarded as ``sent`` (each ``(method, target, body)``), the engine's answer relayed."""
    return Expect(frozenset({200}), None, body=body, answers=len(sent), sent=sent, **more)


def refused(status: int | set[int], reason: str, *mentions: str, **more: Any) -> Expect:
    """Answered by the proxy itself; nothing reaches the engine."""
    statuses = frozenset(status if isinstance(status, set) else {status})
    more.setdefault("closed", True)
    return Expect(statuses, reason, mentions, sent=(), **more)


def relayed(status: int, body: bytes | None, **more: Any) -> Expect:
    """The engine's answer, passed on."""
    return Expect(frozenset({status}), None, body=body, **more)


@frozen
class Row:
    """One case: its bytes, the documented verdict, and nginx's where it was checked.

    :ivar data: for a request row the client's bytes; for a response row the engine's.
    :ivar request: for a response row, what the client asks.
    """

    name: str
    data: bytes
    expect: Expect
    nginx: str
    request: bytes = b"GET /props HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"


H = b"Host: localhost:8080\r\n"
GET = b"GET /props HTTP/1.1\r\n" + H
POST = b"POST /props HTTP/1.1\r\n" + H
CHUNKED = b"Transfer-Encoding: chunked\r\n"
CLOSE = b"Connection: close\r\n"

REQUEST_ROWS = [
    # -- served --------------------------------------------------------------------------------
    Row("origin-form", GET + b"\r\n", served((b"GET", b"/props", b"")), "200, forwarded as is"),
    Row(
        "absolute-form-routed-by-path",
        b"GET http://127.0.0.1:8080/props?x=1 HTTP/1.1\r\n" + H + b"\r\n",
        served((b"GET", b"/props?x=1", b"")),
        "200, sent as /props?x=1",
    ),
    Row(
        "query-bytes-kept",
        b"GET /props?a=%20b&c=d/e HTTP/1.1\r\n" + H + b"\r\n",
        served((b"GET", b"/props?a=%20b&c=d/e", b"")),
        "200, query kept",
    ),
    Row(
        "content-length-body",
        POST + b"Content-Length: 5\r\n\r\nhello",
        served((b"POST", b"/props", b"hello"), fields={b"content-length": b"5"}),
        "200, sent with Content-Length: 5",
    ),
    Row(
        "content-length-leading-zeros",
        POST + b"Content-Length: 005\r\n\r\nhello",
        served((b"POST", b"/props", b"hello")),
        "200, sent with Content-Length: 5",
    ),
    Row(
        "content-length-with-spaces",
        POST + b"Content-Length:   5  \r\n\r\nhello",
        served((b"POST", b"/props", b"hello")),
        "200",
    ),
    Row(
        "chunked-body-sent-with-its-length",
        POST + CHUNKED + b"\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        served(
            (b"POST", b"/props", b"hello world"),
            fields={b"content-length": b"11", b"transfer-encoding": None},
        ),
        "200, sent with Content-Length: 11",
    ),
    Row(
        "chunk-extensions-ignored",
        POST + CHUNKED + b'\r\n5;a=1;b="x y"\r\nhello\r\n0;end\r\n\r\n',
        served((b"POST", b"/props", b"hello")),
        "200",
    ),
    Row(
        "chunk-size-upper-case-hex",
        POST + CHUNKED + b"\r\nB\r\nhello world\r\n0\r\n\r\n",
        served((b"POST", b"/props", b"hello world")),
        "200",
    ),
    Row(
        "chunk-size-leading-zeros",
        POST + CHUNKED + b"\r\n0005\r\nhello\r\n0000\r\n\r\n",
        served((b"POST", b"/props", b"hello")),
        "200",
    ),
    Row(
        "chunked-coding-name-any-case",
        POST + b"Transfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        served((b"POST", b"/props", b"hello")),
        "200",
    ),
    Row(
        "trailer-fields-dropped",
        POST + CHUNKED + b"\r\n5\r\nhello\r\n0\r\nX-Checksum: abc\r\n\r\n",
        served((b"POST", b"/props", b"hello"), fields={b"x-checksum": None}),
        "200, trailer dropped",
    ),
    Row(
        "hop-by-hop-fields-dropped",
        GET + b"Connection: x-hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\n"
        b"X-End: kept\r\n\r\n",
        served(
            (b"GET", b"/props", b""),
            fields={b"x-hop": None, b"keep-alive": None, b"te": None, b"x-end": b"kept"},
        ),
        "200, Keep-Alive and TE dropped, X-Hop (named by Connection) sent",
    ),
    Row(
        "field-value-trailing-whitespace-dropped",
        GET + b"X-End: kept \t \r\n\r\n",
        served((b"GET", b"/props", b""), fields={b"x-end": b"kept"}),
        "200, sent with its trailing whitespace",
    ),
    Row(
        "host-trailing-whitespace",
        b"GET /props HTTP/1.1\r\nHost: localhost:8080 \r\n\r\n",
        served((b"GET", b"/props", b"")),
        "200",
    ),
    # RFC 9112 §3.2: an empty Host is what a target without an authority calls for.
    Row(
        "empty-host",
        b"GET /props HTTP/1.1\r\nHost:\r\n\r\n",
        served((b"GET", b"/props", b"")),
        "400",
    ),
    Row(
        "field-value-obs-text-kept",
        GET + b"X-Name: caf\xe9\r\n\r\n",
        served((b"GET", b"/props", b""), fields={b"x-name": b"caf\xe9"}),
        "200, sent as is",
    ),
    Row(
        "empty-field-value",
        GET + b"X-Empty:\r\n\r\n",
        served((b"GET", b"/props", b""), fields={b"x-empty": b""}),
        "200, sent empty",
    ),
    Row(
        "empty-line-before-request-line",
        b"\r\n" + GET + b"\r\n",
        served((b"GET", b"/props", b"")),
        "200",
    ),
    Row(
        "request-line-extra-spaces",
        b"GET  /props  HTTP/1.1\r\n" + H + b"\r\n",
        served((b"GET", b"/props", b"")),
        "200",
    ),
    Row(
        "connection-close-honoured",
        GET + CLOSE + b"\r\n",
        served((b"GET", b"/props", b""), closed=True, answer_fields={b"connection": b"close"}),
        "200 with Connection: close, closed",
    ),
    Row(
        "http10-one-answer-then-close",
        b"GET /props HTTP/1.0\r\n\r\n",
        served((b"GET", b"/props", b""), closed=True, version=b"HTTP/1.0"),
        "200 (an HTTP/1.1 status line), closed",
    ),
    Row(
        "pipelined-answered-in-order",
        GET + b"\r\n" + POST + b"Content-Length: 2\r\n\r\nhiGET /slots HTTP/1.1\r\n" + H + b"\r\n",
        served((b"GET", b"/props", b""), (b"POST", b"/props", b"hi"), (b"GET", b"/slots", b"")),
        "three 200s in order",
    ),
    Row(
        "expect-100-continue",
        POST + b"Expect: 100-continue\r\nContent-Length: 5\r\n\r\nhello",
        served((b"POST", b"/props", b"hello"), fields={b"expect": None}),
        "100 Continue, then 200",
    ),
    Row(
        "head-method",
        b"HEAD /props HTTP/1.1\r\n" + H + b"\r\n",
        served((b"HEAD", b"/props", b""), body=b""),
        "200, no body",
    ),
    Row(
        "method-llhttp-knows-forwarded",
        b"PROPFIND /props HTTP/1.1\r\n" + H + b"\r\n",
        served((b"PROPFIND", b"/props", b"")),
        "200, forwarded",
    ),
    Row(
        "upgrade-h2c-ignored-body-kept",
        POST + b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        b"HTTP2-Settings: AAMAAABkAAQAAP__\r\nContent-Length: 5\r\n\r\nhello"
        b"GET /slots HTTP/1.1\r\n" + H + b"\r\n",
        served((b"POST", b"/props", b"hello"), (b"GET", b"/slots", b""), fields={b"upgrade": None}),
        "two 200s, body sent, Upgrade dropped",
    ),
    Row(
        "upgrade-with-connection-close-body-kept",
        POST + b"Connection: Upgrade, close\r\nUpgrade: h2c\r\nContent-Length: 5\r\n\r\nhello",
        served((b"POST", b"/props", b"hello"), closed=True),
        "200, body sent",
    ),
    Row(
        "upgrade-websocket-ignored-next-request-served",
        GET + b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n" + GET + b"\r\n",
        served((b"GET", b"/props", b""), (b"GET", b"/props", b"")),
        "two 200s, Upgrade dropped",
    ),
    # -- refused at the head -------------------------------------------------------------------
    Row(
        "http11-without-host",
        b"GET /props HTTP/1.1\r\n\r\n",
        refused(400, "bad-request", "Host"),
        "400",
    ),
    Row(
        "two-hosts",
        GET + b"Host: other\r\n\r\n",
        refused(400, "bad-request", "Host"),
        "400",
    ),
    Row(
        "host-not-a-host",
        b"GET /props HTTP/1.1\r\nHost: a b\r\n\r\n",
        refused(400, "bad-request", "Host"),
        "400",
    ),
    # RFC 9112 §3.2.1: origin-form is a path and a query, no fragment.
    Row(
        "fragment-in-target",
        b"GET /props#x HTTP/1.1\r\n" + H + b"\r\n",
        refused(400, "bad-request", "target"),
        "200, sent with the fragment",
    ),
    Row(
        "asterisk-form",
        b"OPTIONS * HTTP/1.1\r\n" + H + b"\r\n",
        refused(400, "bad-request", "target"),
        "400",
    ),
    Row(
        "authority-form",
        b"GET localhost:8080 HTTP/1.1\r\n" + H + b"\r\n",
        refused(400, "bad-request", "target"),
        "400",
    ),
    # RFC 9110 §9.1: a method the server does not implement SHOULD be 501; CONNECT's tunnel is
    # a forward proxy's, which no facade is.
    Row(
        "connect",
        b"CONNECT localhost:8080 HTTP/1.1\r\n" + H + b"\r\n",
        refused(501, "not-implemented", "CONNECT"),
        "400",
    ),
    Row(
        "relative-target",
        b"GET props HTTP/1.1\r\n" + H + b"\r\n",
        refused(400, "bad-request", "target"),
        "400",
    ),
    Row(
        "http-1-2",
        b"GET /props HTTP/1.2\r\n" + H + b"\r\n",
        refused(400, "bad-request"),
        "200, served as HTTP/1.1",
    ),
    Row(
        "http-2-0-line",
        b"GET /props HTTP/2.0\r\n" + H + b"\r\n",
        refused(400, "bad-request"),
        "505",
    ),
    Row(
        "lower-case-version",
        b"GET /props http/1.1\r\n" + H + b"\r\n",
        refused(400, "bad-request"),
        "400",
    ),
    Row(
        "not-http",
        b"\x01\x02 hello there\r\n\r\n",
        refused(400, "bad-request", "request line"),
        "400",
    ),
    Row(
        "ssh-banner",
        b"SSH-2.0-OpenSSH_9.6\r\n",
        refused(400, "bad-request", "request line"),
        "400",
    ),
    Row(
        "http2-preface",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        refused(400, "bad-request", "HTTP/1.1"),
        "400",
    ),
    # RFC 9112 §6.1: Transfer-Encoding in an HTTP/1.0 request is faulty framing.
    Row(
        "transfer-encoding-in-http10",
        b"POST /props HTTP/1.0\r\n" + CHUNKED + b"\r\n5\r\nhello\r\n0\r\n\r\n",
        refused(400, "bad-request", "HTTP/1.0"),
        "400",
    ),
    Row(
        "tls-first-byte-outside-a-cluster",
        b"\x16\x03\x01\x00\x05hello",
        Expect(frozenset(), answers=0, closed=True, sent=()),
        "400 (no TLS on that port)",
    ),
    Row(
        "obs-fold",
        GET + b"X-A: a\r\n b\r\n\r\n",
        refused(400, "bad-request", "fold"),
        "400",
    ),
    Row(
        "bare-lf",
        b"GET /props HTTP/1.1\nHost: localhost\n\n",
        refused(400, "bad-request"),
        "200, accepted",
    ),
    Row("bare-cr-in-value", GET + b"X-A: a\rb\r\n\r\n", refused(400, "bad-request"), "400"),
    Row("nul-in-value", GET + b"X-A: a\x00b\r\n\r\n", refused(400, "bad-request"), "400"),
    Row(
        "control-byte-in-value",
        GET + b"X-A: a\x01b\r\n\r\n",
        refused(400, "bad-request"),
        "200, the byte forwarded",
    ),
    Row("nul-in-name", GET + b"X\x00A: a\r\n\r\n", refused(400, "bad-request"), "400"),
    Row("space-before-colon", GET + b"X-A : a\r\n\r\n", refused(400, "bad-request"), "400"),
    Row("field-without-colon", GET + b"X-A a\r\n\r\n", refused(400, "bad-request"), "400"),
    Row(
        "head-over-16-kib",
        GET + b"X-A: " + b"v" * (17 * 1024) + b"\r\n\r\n",
        refused(400, "bad-request", "16 KiB"),
        "400 (header too large)",
    ),
    # Likely one read: the bound counts the read that began the head.
    Row(
        "head-over-16-kib-unfinished",
        GET + b"X-A: " + b"v" * (20 * 1024),
        refused(400, "bad-request", "16 KiB"),
        "400 (header too large)",
    ),
    Row(
        "content-length-and-chunked",
        POST + b"Content-Length: 5\r\n" + CHUNKED + b"\r\n5\r\nhello\r\n0\r\n\r\n",
        refused(400, "bad-request"),
        "400",
    ),
    Row(
        "two-equal-content-lengths",
        POST + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        refused(400, "bad-request"),
        "400",
    ),
    Row(
        "two-different-content-lengths",
        POST + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        refused(400, "bad-request"),
        "400",
    ),
    Row(
        "content-length-list",
        POST + b"Content-Length: 5, 5\r\n\r\nhello",
        refused(400, "bad-request"),
        "400",
    ),
    Row(
        "content-length-plus",
        POST + b"Content-Length: +5\r\n\r\nhello",
        refused(400, "bad-request"),
        "400",
    ),
    Row(
        "content-length-negative",
        POST + b"Content-Length: -1\r\n\r\n",
        refused(400, "bad-request"),
        "400",
    ),
    Row(
        "content-length-hex",
        POST + b"Content-Length: 0x5\r\n\r\nhello",
        refused(400, "bad-request"),
        "400",
    ),
    Row(
        "content-length-overflow",
        POST + b"Content-Length: " + b"9" * 25 + b"\r\n\r\n",
        refused(400, "bad-request"),
        "400",
    ),
    Row(
        "chunk-size-overflow",
        POST + CHUNKED + b"\r\n10000000000000000\r\nhello",
        refused(400, "bad-request"),
        "400",
    ),
    Row(
        "chunk-size-not-hex",
        POST + CHUNKED + b"\r\nzz\r\nhello\r\n0\r\n\r\n",
        refused(400, "bad-request"),
        "400",
    ),
    Row(
        "chunk-size-trailing-space",
        POST + CHUNKED + b"\r\n5 \r\nhello\r\n0\r\n\r\n",
        refused(400, "bad-request"),
        "200, accepted",
    ),
    Row(
        "chunk-extension-without-name",
        POST + CHUNKED + b"\r\n5;\r\nhello\r\n0\r\n\r\n",
        refused(400, "bad-request"),
        "200, accepted",
    ),
    Row(
        "chunk-data-without-crlf",
        POST + CHUNKED + b"\r\n5\r\nhelloXX0\r\n\r\n",
        refused(400, "bad-request"),
        "400",
    ),
    # -- not implemented -----------------------------------------------------------------------
    Row(
        "gzip-then-chunked",
        POST + b"Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        refused(501, "not-implemented"),
        "501",
    ),
    # RFC 9112 §6.3 asks 400 when chunked is not last; 501 for every coding but chunked alone,
    # as nginx has it.
    Row(
        "chunked-then-gzip",
        POST + b"Transfer-Encoding: chunked, gzip\r\n\r\nhello",
        refused(501, "not-implemented"),
        "501",
    ),
    Row(
        "chunked-twice",
        POST + b"Transfer-Encoding: chunked, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        refused(501, "not-implemented"),
        "501",
    ),
    Row(
        "gzip-alone",
        POST + b"Transfer-Encoding: gzip\r\n\r\nhello",
        refused(501, "not-implemented"),
        "501",
    ),
    Row(
        "identity-coding",
        POST + b"Transfer-Encoding: identity\r\n\r\nhello",
        refused(501, "not-implemented"),
        "501",
    ),
    Row(
        "extension-method",
        b"FOO /props HTTP/1.1\r\n" + H + b"\r\n",
        refused(501, "not-implemented"),
        "200, forwarded",
    ),
    Row(
        "lower-case-method",
        b"get /props HTTP/1.1\r\n" + H + b"\r\n",
        refused(501, "not-implemented"),
        "400",
    ),
    # llhttp knows RTSP's methods, and refuses them in HTTP/1.x.
    Row(
        "rtsp-method",
        b"DESCRIBE /props HTTP/1.1\r\n" + H + b"\r\n",
        refused(501, "not-implemented", "method"),
        "200, forwarded",
    ),
    # PRI is HTTP/2's preface: llhttp takes it for nothing else.
    Row(
        "pri-method",
        b"PRI /props HTTP/1.1\r\n" + H + b"\r\n",
        refused(501, "not-implemented", "method"),
        "200, forwarded",
    ),
    # -- the body cap --------------------------------------------------------------------------
    Row(
        "declared-length-over-the-cap",
        POST + b"Content-Length: 2048\r\n\r\n" + b"x" * 2048,
        refused(413, "body-too-large"),
        "413, connection kept, body discarded",
    ),
    Row(
        "chunked-body-over-the-cap",
        POST + CHUNKED + b"\r\n" + b"400\r\n" + b"x" * 1024 + b"\r\n1\r\nx\r\n0\r\n\r\n",
        refused(413, "body-too-large"),
        "413, closed",
    ),
    Row(
        "expect-100-continue-over-the-cap",
        POST + b"Expect: 100-continue\r\nContent-Length: 2048\r\n\r\n",
        refused(413, "body-too-large"),
        "413 instead of 100 Continue",
    ),
    Row(
        "whole-body-written-before-reading-the-refusal",
        POST + b"Content-Length: 3145728\r\n\r\n" + b"x" * 3145728,
        refused(413, "body-too-large"),
        "413, read by the client (lingering close)",
    ),
]

OK = b"HTTP/1.1 200 OK\r\n"
TE = b"Transfer-Encoding: chunked\r\n"
HEAD_REQUEST = b"HEAD /props HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
GONE = (502, "upstream-transport")

RESPONSE_ROWS = [
    # -- relayed -------------------------------------------------------------------------------
    Row(
        "content-length-body",
        OK + b"Content-Length: 5\r\n\r\nhello",
        relayed(200, b"hello", answer_fields={b"content-length": b"5"}),
        "200, Content-Length: 5",
    ),
    Row(
        "chunked-body",
        OK + TE + b"\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        relayed(200, b"hello world"),
        "200, chunked again",
    ),
    Row(
        "chunk-extensions-and-trailers",
        OK + TE + b'\r\n5;a="b c"\r\nhello\r\n0\r\nX-Checksum: abc\r\n\r\n',
        relayed(200, b"hello", answer_fields={b"x-checksum": None}),
        "200, trailer dropped",
    ),
    Row(
        "chunk-size-leading-zeros",
        OK + TE + b"\r\n00000005\r\nhello\r\n0\r\n\r\n",
        relayed(200, b"hello"),
        "200",
    ),
    Row(
        "body-delimited-by-the-close",
        OK + b"Content-Type: text/plain\r\n\r\nuntil the end",
        relayed(200, b"until the end"),
        "200, chunked to the client",
    ),
    Row(
        "http10-answer-by-the-close",
        b"HTTP/1.0 200 OK\r\n\r\nold style",
        relayed(200, b"old style"),
        "200, chunked to the client",
    ),
    Row(
        "bytes-past-content-length-dropped",
        OK + b"Content-Length: 5\r\n\r\nhelloEXTRA",
        relayed(200, b"hello"),
        "200, 5 bytes (and a warning)",
    ),
    Row(
        "interim-answers-skipped",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n"
        + OK
        + b"Content-Length: 2\r\n\r\nok",
        relayed(200, b"ok"),
        "relays the 100 as the answer, the rest as its body",
    ),
    Row(
        "empty-reason-phrase",
        b"HTTP/1.1 200 \r\nContent-Length: 2\r\n\r\nok",
        relayed(200, b"ok"),
        "200",
    ),
    Row(
        "empty-line-before-status-line",
        b"\r\n" + OK + b"Content-Length: 2\r\n\r\nok",
        relayed(200, b"ok"),
        "no valid head: the bytes relayed raw (HTTP/0.9)",
    ),
    Row(
        "hop-by-hop-fields-dropped",
        OK + b"Connection: x-hop, keep-alive\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\n"
        b"X-End: kept\r\nContent-Length: 2\r\n\r\nok",
        relayed(
            200,
            b"ok",
            answer_fields={b"x-hop": None, b"keep-alive": None, b"x-end": b"kept"},
        ),
        "200, Keep-Alive dropped, X-Hop kept",
    ),
    Row(
        "field-value-whitespace-trimmed",
        OK + b"X-End:   kept \t\r\nContent-Length: 2\r\n\r\nok",
        relayed(200, b"ok", answer_fields={b"x-end": b"kept"}),
        "200, trailing whitespace kept",
    ),
    Row(
        "no-content-has-no-length",
        b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
        relayed(204, b"", answer_fields={b"content-length": None, b"transfer-encoding": None}),
        "204 with Content-Length: 0",
    ),
    Row(
        "not-modified-has-no-length",
        b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
        relayed(304, b"", answer_fields={b"content-length": None, b"transfer-encoding": None}),
        "304 with Content-Length: 5",
    ),
    Row(
        "no-content-to-head-has-no-length",
        b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
        relayed(204, b"", answer_fields={b"content-length": None}),
        "204 with Content-Length: 5",
        request=HEAD_REQUEST,
    ),
    Row(
        "head-answer-keeps-its-length",
        OK + b"Content-Length: 20\r\n\r\n",
        relayed(200, b"", answer_fields={b"content-length": b"20"}),
        "200, Content-Length: 20",
        request=HEAD_REQUEST,
    ),
    Row(
        "http10-client-gets-no-chunks",
        OK + TE + b"\r\n5\r\nhello\r\n0\r\n\r\n",
        relayed(
            200,
            b"hello",
            version=b"HTTP/1.0",
            closed=True,
            answer_fields={b"transfer-encoding": None},
        ),
        "200, unframed, closed",
        request=b"GET /props HTTP/1.0\r\n\r\n",
    ),
    Row(
        "no-reason-phrase-nor-its-space",
        b"HTTP/1.1 204\r\n\r\n",
        relayed(204, b""),
        "204",
    ),
    Row(
        "chunked-coding-name-any-case",
        OK + b"Transfer-Encoding: ChUnKeD\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        relayed(200, b"{}"),
        "200, chunked again",
    ),
    # RFC 9112 §6.1: faulty framing, read as it says (its connection is not reused).
    Row(
        "http10-answer-chunked",
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n" + TE + b"\r\n2\r\n{}\r\n0\r\n\r\n",
        relayed(200, b"{}"),
        "200, chunked again",
    ),
    Row(
        "head-answer-chunked-has-no-body",
        OK + TE + b"\r\n",
        relayed(200, b"", answer_fields={b"transfer-encoding": None}),
        "200, no body",
        request=HEAD_REQUEST,
    ),
    # A HEAD answer has no body to be coded.
    Row(
        "head-answer-in-another-coding",
        OK + b"Transfer-Encoding: gzip\r\n\r\n",
        relayed(200, b"", answer_fields={b"transfer-encoding": None}),
        "200, no body",
        request=HEAD_REQUEST,
    ),
    Row(
        "not-modified-chunked-has-no-body",
        b"HTTP/1.1 304 Not Modified\r\n" + TE + b"\r\n",
        relayed(304, b"", answer_fields={b"transfer-encoding": None}),
        "304, no body",
    ),
    Row(
        "interim-answer-with-a-length",
        b"HTTP/1.1 100 Continue\r\nContent-Length: 5\r\n\r\n" + OK + b"Content-Length: 2\r\n\r\n{}",
        relayed(200, b"{}"),
        "relays the 100 as the answer, the rest as its body",
    ),
    Row(
        "status-the-proxy-does-not-know",
        b"HTTP/1.1 299 Whatever\r\nContent-Length: 2\r\n\r\nok",
        relayed(299, b"ok"),
        "299 relayed",
    ),
    # -- cut short after the first body byte: relayed as far as it went ----------------------------
    Row(
        "closed-before-its-length",
        OK + b"Content-Length: 10\r\n\r\nhello",
        relayed(200, None, cut=True, closed=True),
        "200, 5 of 10 bytes, closed",
    ),
    Row(
        "chunked-cut-mid-chunk",
        OK + TE + b"\r\n5\r\nhello\r\n10\r\nwor",
        relayed(200, None, cut=True, closed=True),
        "200, cut short, closed",
    ),
    Row(
        "framing-field-in-the-trailer",
        OK + TE + b"\r\n2\r\n{}\r\n0\r\nContent-Length: 9\r\n\r\n",
        relayed(200, None, cut=True, closed=True),
        "200, trailer dropped",
    ),
    Row(
        "bad-chunk-framing-after-the-first-byte",
        OK + TE + b"\r\n5\r\nhello\r\nzz\r\n",
        relayed(200, None, cut=True, closed=True),
        "closed without an answer (body buffered)",
    ),
    # -- refused: 502 upstream-transport ------------------------------------------------------
    Row(
        "head-then-close",
        OK + b"Content-Length: 10\r\n\r\n",
        refused(*GONE),
        "200 head, no body, closed",
    ),
    Row(
        "chunked-head-then-close",
        OK + TE + b"\r\n",
        refused(*GONE),
        "200 head, no body, closed",
    ),
    Row("nothing-then-close", b"", refused(*GONE), "502"),
    Row("four-digit-status", b"HTTP/1.1 2000 OK\r\n\r\n", refused(*GONE), "2000 relayed"),
    Row("not-http", b"SSH-2.0-OpenSSH_9.6\r\n", refused(*GONE), "the bytes relayed raw (HTTP/0.9)"),
    Row(
        "content-length-and-chunked",
        OK + b"Content-Length: 5\r\n" + TE + b"\r\n5\r\nhello\r\n0\r\n\r\n",
        refused(*GONE),
        "200, read as chunked",
    ),
    Row(
        "two-different-content-lengths",
        OK + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        refused(*GONE),
        "200, the last length used",
    ),
    Row(
        "two-equal-content-lengths",
        OK + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        refused(*GONE),
        "200",
    ),
    Row(
        "content-length-negative",
        OK + b"Content-Length: -5\r\n\r\nhello",
        refused(*GONE),
        "200, read to the close",
    ),
    Row("content-length-list", OK + b"Content-Length: 2, 2\r\n\r\n{}", refused(*GONE), "200"),
    Row("content-length-plus", OK + b"Content-Length: +2\r\n\r\n{}", refused(*GONE), "200"),
    Row(
        "content-length-overflow",
        OK + b"Content-Length: 99999999999999999999\r\n\r\n",
        refused(*GONE),
        "200, an empty body",
    ),
    Row("obs-fold", OK + b"X-A: a\r\n b\r\nContent-Length: 2\r\n\r\nok", refused(*GONE), "502"),
    Row("bare-lf", b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", refused(*GONE), "200, accepted"),
    Row("nul-in-value", OK + b"X-A: a\x00b\r\nContent-Length: 2\r\n\r\nok", refused(*GONE), "502"),
    Row(
        "bare-cr-in-value", OK + b"X-A: a\rb\r\nContent-Length: 2\r\n\r\nok", refused(*GONE), "502"
    ),
    Row("space-before-colon", OK + b"Content-Length : 2\r\n\r\nok", refused(*GONE), "502"),
    Row(
        "field-without-colon",
        OK + b"XYZ\r\nContent-Length: 2\r\n\r\nok",
        refused(*GONE),
        "200, the line dropped",
    ),
    Row(
        "status-600",
        b"HTTP/1.1 600 Beyond\r\nContent-Length: 2\r\n\r\nok",
        refused(*GONE),
        "600 relayed",
    ),
    Row(
        "switching-protocols",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n",
        refused(*GONE),
        "101 relayed",
    ),
    Row(
        "http-2-0-status-line",
        b"HTTP/2.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
        refused(*GONE),
        "200, accepted",
    ),
    Row(
        "head-over-64-kib",
        OK + b"X-A: " + b"v" * (65 * 1024) + b"\r\nContent-Length: 2\r\n\r\nok",
        refused(*GONE),
        "502 (too big header)",
    ),
    Row(
        "interim-answers-over-64-kib",
        b"HTTP/1.1 100 Continue\r\n\r\n" * 2700 + OK + b"Content-Length: 2\r\n\r\nok",
        refused(*GONE),
        "relays the first 100 as the answer",
    ),
    Row(
        "bad-chunk-size-before-the-first-byte",
        OK + TE + b"\r\nzz\r\nhello\r\n0\r\n\r\n",
        refused(*GONE),
        "closed without an answer",
    ),
    # A transfer coding other than chunked alone is refused: relayed, its bytes would reach
    # the client still coded with nothing left to say so (docs/robustness.md#engine-answers).
    Row(
        "whitespace-after-chunk-size",
        OK + TE + b"\r\n2 \r\n{}\r\n0\r\n\r\n",
        refused(*GONE),
        "200, accepted",
    ),
    Row("bare-lf-in-chunk-lines", OK + TE + b"\r\n2\n{}\n0\n\n", refused(*GONE), "200, accepted"),
    Row(
        "chunk-size-overflow",
        OK + TE + b"\r\nfffffffffffffffffff\r\n",
        refused(*GONE),
        "closed without an answer",
    ),
    Row(
        "gzip-coded-body",
        OK + b"Transfer-Encoding: gzip\r\n\r\n\x1f\x8b\x08\x00",
        refused(*GONE),
        "200, the coded bytes chunked again",
    ),
    Row(
        "gzip-then-chunked-body",
        OK + b"Transfer-Encoding: gzip, chunked\r\n\r\n4\r\n\x1f\x8b\x08\x00\r\n0\r\n\r\n",
        refused(*GONE),
        "200, the coded bytes chunked again",
    ),
    # RFC 9112 allows a tab after the coding, llhttp does not take it as chunked: read by
    # either view alone the body would be framed one way and relayed another.
    Row(
        "tab-after-chunked",
        OK + b"Transfer-Encoding: chunked\t\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        refused(*GONE),
        "not checked",
    ),
    Row(
        "chunked-then-gzip-body",
        OK + b"Transfer-Encoding: chunked, gzip\r\n\r\n{}",
        refused(*GONE),
        "closed without an answer",
    ),
    Row(
        "codings-over-two-fields",
        OK + b"Transfer-Encoding: gzip\r\n" + TE + b"\r\n2\r\n{}\r\n0\r\n\r\n",
        refused(*GONE),
        "200, read as chunked",
    ),
    Row(
        "chunked-twice-body",
        OK + b"Transfer-Encoding: chunked, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        refused(*GONE),
        "200, read as chunked",
    ),
    Row(
        "identity-coded-body",
        OK + b"Transfer-Encoding: identity\r\n\r\n{}",
        refused(*GONE),
        "200, read to the close",
    ),
    Row(
        "empty-coding",
        OK + b"Transfer-Encoding: \r\n\r\n{}",
        refused(*GONE),
        "200, read to the close",
    ),
]


# -- the listener, the engine and the client ------------------------------------------------------


class EngineStandIn(Protocol):
    """A loopback engine: records each whole request it is sent; answers ``script`` (then
    closes) or, without one, ``200 ok`` on a kept-alive connection."""

    def __init__(self, script: bytes | None, seen: list[bytes]) -> None:
        self.script = script
        self.seen = seen
        self.buffer = b""

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            length = _declared_length(head)
            if len(rest) < length:
                return
            self.seen.append(head + b"\r\n\r\n" + rest[:length])
            self.buffer = rest[length:]
            assert self.transport is not None
            if self.script is None:
                self.transport.write(ENGINE_ANSWER)
                continue
            self.transport.write(self.script)
            self.transport.loseConnection()
            return


def _declared_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


@contextlib.asynccontextmanager
async def facade(tmp_path: Path, script: bytes | None, seen: list[bytes]) -> AsyncIterator[int]:
    """A llama.cpp facade on 127.0.0.1 (the FacadeManager's listener) in front of one engine
    stand-in; yields the facade's port."""
    engines = Factory.forProtocol(lambda: EngineStandIn(script, seen))
    engine = reactor.listenTCP(0, engines, interface="127.0.0.1")
    path, upstream = one_node_path(tmp_path, f"http://127.0.0.1:{engine.getHost().port}")
    manager = FacadeManager(
        reactor,
        path,
        _Silent(),
        state_dir=tmp_path,
        bind="127.0.0.1",
        max_request_body=MAX_BODY,
        bodies=BodyBudget(),
    )
    port = free_port()
    manager.enable("llamacpp", port, [], True)
    try:
        yield port
    finally:
        await manager.stop()
        await upstream.close()
        await engine.stopListening()


class _Silent:
    """The broker link: nothing listens in these rows."""

    def notify(self, method: str, params: dict[str, object]) -> None:
        pass

    def call(self, method: str, params: dict[str, object]) -> Deferred[object]:
        return Deferred()


def talk(
    port: int,
    data: bytes,
    methods: list[bytes | None],
    answers: int,
    *,
    to_close: bool,
    done_sending: bool,
) -> tuple[bytes, bool]:
    """A raw client (blocking, on a thread): write ``data`` whole, then read until ``answers``
    final answers are in (and, with ``to_close``, until the proxy closes). Returns what it read
    and whether the proxy closed.

    :param done_sending: once the answers are read, shut the sending side, so that a proxy that
        reads on after a refusal (its lingering close) sees the end of what comes and closes.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=PATIENCE) as client:
        # A send buffer of a fixed, small size: a body far larger than it is only written
        # whole if the proxy reads it (the kernel would otherwise absorb megabytes).
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        try:
            client.sendall(data)
        except OSError:
            return b"", True
        received, closed = _read(client, methods, answers, to_close=to_close and not done_sending)
        if closed or not done_sending:
            return received, closed
        try:
            client.shutdown(socket.SHUT_WR)
        except OSError:
            return received, True
        if not to_close:
            return received, False
        more, closed = _read(client, methods, 0, to_close=True)
        return received + more, closed


def _read(
    client: socket.socket, methods: list[bytes | None], answers: int, *, to_close: bool
) -> tuple[bytes, bool]:
    received = b""
    while True:
        try:
            chunk = client.recv(1 << 16)
        except TimeoutError:
            return received, False
        except OSError:
            return received, True
        if not chunk:
            return received, True
        received += chunk
        if not to_close and _finals(received, methods) >= answers:
            return received, False


def _finals(data: bytes, methods: list[bytes | None]) -> int:
    try:
        return sum(1 for r in read_stream(data, methods, closed=False) if not r.interim)
    except Malformed:
        return 0


def _methods_of(data: bytes, count: int) -> list[bytes | None]:
    """The method of each request in ``data`` (a row's bytes), as far as the answers go."""
    words = [line.split(b" ", 1)[0] for line in data.split(b"\r\n") if b" HTTP/1." in line]
    return [*[w if w.isalpha() and w.isupper() else None for w in words][:count], None]


# -- judging --------------------------------------------------------------------------------------


def judge(
    expect: Expect, received: bytes, closed: bool, methods: list[bytes | None], sent: list[bytes]
) -> None:
    cut = expect.cut
    try:
        answers = [r for r in read_stream(received, methods, closed=closed) if not r.interim]
    except Malformed:
        if not cut:
            raise
        answers = [_cut_answer(received)]
    assert len(answers) == expect.answers, f"{len(answers)} answers: {received[:300]!r}"
    if expect.closed is not None:
        assert closed == expect.closed
    if expect.sent is not None:
        assert [_request_line_and_body(r) for r in sent] == list(expect.sent)
    if not answers:
        return
    last = answers[-1]
    assert last.status in expect.status, received[:300]
    assert last.version == expect.version
    assert last.value(b"x-nvpair-error") == (
        None if expect.reason is None else expect.reason.encode()
    )
    if expect.reason is not None:
        assert last.value(b"x-nvpair-node") is None
        message = last.body.decode("utf-8", "replace").lower()
        for word in expect.mentions:
            assert word.lower() in message, message
    elif expect.body is not None:
        assert last.body == expect.body
    for name, value in expect.answer_fields.items():
        assert last.value(name) == value, (name, last.headers)
    for name, wanted in expect.fields.items():
        assert sent, "nothing reached the engine"
        assert _field(sent[0], name) == wanted, (name, sent[0][:300])


def _cut_answer(received: bytes) -> WireResponse:
    """An answer whose body ended early: its head parsed, its body whatever came."""
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *lines = head.split(b"\r\n")
    fields = tuple((n.strip(), v.strip()) for n, _, v in (line.partition(b":") for line in lines))
    return WireResponse(0, int(status_line.split()[1]), b"", status_line[:8], fields, body, True)


def _request_line_and_body(request: bytes) -> tuple[bytes, bytes, bytes]:
    head, _, body = request.partition(b"\r\n\r\n")
    method, target, _ = head.split(b"\r\n", 1)[0].split(b" ")
    return method, target, body


def _field(request: bytes, name: bytes) -> bytes | None:
    head = request.partition(b"\r\n\r\n")[0]
    # Only what precedes a value is whitespace of the line; what ends it is the value's own.
    values = [
        value.lstrip(b" \t")
        for line_name, _, value in (line.partition(b":") for line in head.split(b"\r\n")[1:])
        if line_name.lower() == name
    ]
    return b", ".join(values) if values else None


def _params(rows: list[Row]) -> list[Any]:
    return [pytest.param(row, id=row.name) for row in rows]


@pytest.mark.parametrize("row", _params(REQUEST_ROWS))
@pytest_twisted.ensureDeferred
async def test_request(row: Row, tmp_path: Path) -> None:
    sent: list[bytes] = []
    expect = row.expect
    methods = _methods_of(row.data, expect.answers)
    async with facade(tmp_path, None, sent) as port:
        received, closed = await deferToThread(
            talk,
            port,
            row.data,
            methods,
            expect.answers,
            to_close=bool(expect.closed),
            done_sending=expect.reason is not None,
        )
    judge(expect, received, closed, methods, sent)


@pytest.mark.parametrize("row", _params(RESPONSE_ROWS))
@pytest_twisted.ensureDeferred
async def test_response(row: Row, tmp_path: Path) -> None:
    sent: list[bytes] = []
    expect = row.expect
    methods = _methods_of(row.request, 1)
    to_close = bool(expect.closed) or b"Connection: close" in row.request or expect.cut
    async with facade(tmp_path, row.data, sent) as port:
        received, closed = await deferToThread(
            talk, port, row.request, methods, 1, to_close=to_close, done_sending=False
        )
    judge(expect, received, closed, methods, [])


def test_each_row_has_a_name_of_its_own() -> None:
    for rows in (REQUEST_ROWS, RESPONSE_ROWS):
        names = [row.name for row in rows]
        assert len(set(names)) == len(names)


def _read_to_close(client: socket.socket) -> bytes:
    with client:
        return _read(client, [None], 0, to_close=True)[0]


@pytest_twisted.ensureDeferred
async def test_a_refusal_reaches_a_client_that_stopped_sending_before_the_proxy_read(
    tmp_path: Path,
) -> None:
    """A queued refusal would be dropped with the connection when the end of the client's
    stream is read before the reactor's next write turn: the outlet sends it at once
    (docs/robustness.md#refusals-at-the-request-head)."""
    async with facade(tmp_path, None, []) as port:
        # Written and half-closed from the reactor's own thread, so the head and the end of the
        # stream are both there when the proxy first reads.
        client = socket.create_connection(("127.0.0.1", port), timeout=PATIENCE)
        client.sendall(POST + b"Content-Length: 2048\r\n\r\n")
        client.shutdown(socket.SHUT_WR)
        received = await deferToThread(_read_to_close, client)
    (answer,) = read_stream(received, [None], closed=True)
    assert (answer.status, answer.value(b"x-nvpair-error")) == (413, b"body-too-large")
