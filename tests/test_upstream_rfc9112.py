# -*- test-case-name: tests.test_upstream_rfc9112 -*-
"""What the upstream client does with each kind of response RFC 9112 describes, one row per
case: the section it comes from, the bytes an engine sends, and the verdict — answered (with
its status, body and whether the connection is kept), refused at the head (the attempt fails
at the transport, docs/robustness.md#engine-answers), or broken in its body.

Each row drives a real :class:`~nvpair.upstream_conn.UpstreamConnection` in memory, as
``tests/test_upstream_conn.py`` does.
"""

from __future__ import annotations

import pytest
from attrs import frozen
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed, ResponseNeverReceived
from twisted.web.http import PotentialDataLoss

from tests.test_bodies import result_of
from tests.test_upstream_conn import Rig, read


@frozen
class Answered:
    status: int
    body: bytes
    reused: bool
    #: Header names the answer must not expose (trailers, framing).
    absent: tuple[bytes, ...] = ()


@frozen
class Refused:
    """The head is refused: ResponseNeverReceived, the connection closed."""


@frozen
class Broken:
    """The head is taken, the body ends as a failure, the connection is not kept."""

    body: bytes = b""


@frozen
class Case:
    section: str
    wire: bytes
    verdict: Answered | Refused | Broken
    method: bytes = b"GET"
    #: How the engine's side ends after ``wire``; None: it stays open.
    then: type[Exception] | None = None


OK = b"HTTP/1.1 200 OK\r\n"
CHUNKED = OK + b"Transfer-Encoding: chunked\r\n\r\n"

CORPUS: dict[str, Case] = {
    # §4 Status line
    "status-line": Case("4", OK + b"Content-Length: 2\r\n\r\n{}", Answered(200, b"{}", True)),
    "no-reason-phrase": Case("4", b"HTTP/1.1 204\r\n\r\n", Answered(204, b"", True)),
    "four-digit-status": Case("4", b"HTTP/1.1 2000 OK\r\n\r\n", Refused()),
    "http-2-version": Case("2.3", b"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n", Refused()),
    "http-0.9": Case("2.3", b"{}", Refused(), then=ConnectionDone),
    "bare-lf-lines": Case("2.2", b"HTTP/1.1 200 OK\nContent-Length: 0\n\n", Refused()),
    "101-switching": Case(
        "6.3", b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", Refused()
    ),
    # §5 Field syntax
    "space-before-colon": Case("5.1", OK + b"Content-Length : 0\r\n\r\n", Refused()),
    "obs-fold": Case("5.2", OK + b"X: a\r\n b\r\nContent-Length: 0\r\n\r\n", Refused()),
    "bare-cr-in-value": Case("5.5", OK + b"X: a\rb\r\nContent-Length: 0\r\n\r\n", Refused()),
    "nul-in-value": Case("5.5", OK + b"X: a\x00b\r\nContent-Length: 0\r\n\r\n", Refused()),
    "field-without-colon": Case("5.1", OK + b"XYZ\r\nContent-Length: 0\r\n\r\n", Refused()),
    # §6.1 Transfer-Encoding
    "chunked": Case("6.1", CHUNKED + b"2\r\n{}\r\n0\r\n\r\n", Answered(200, b"{}", True)),
    "chunked-any-case": Case(
        "6.1",
        OK + b"Transfer-Encoding: ChUnKeD\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        Answered(200, b"{}", True, absent=(b"transfer-encoding",)),
    ),
    "gzip-then-chunked": Case(
        "6.1", OK + b"Transfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", Refused()
    ),
    "chunked-then-gzip": Case("6.1", OK + b"Transfer-Encoding: chunked, gzip\r\n\r\n{}", Refused()),
    "codings-over-two-fields": Case(
        "6.1",
        OK + b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        Refused(),
    ),
    "chunked-twice": Case(
        "6.1", OK + b"Transfer-Encoding: chunked, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", Refused()
    ),
    "identity": Case("6.1", OK + b"Transfer-Encoding: identity\r\n\r\n{}", Refused()),
    "empty-coding": Case("6.1", OK + b"Transfer-Encoding: \r\n\r\n{}", Refused()),
    "http-1.0-chunked": Case(
        "6.1",
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\n{}\r\n0\r\n\r\n",
        Answered(200, b"{}", False),
    ),
    "chunked-with-length": Case(
        "6.3", OK + b"Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n{}", Refused()
    ),
    # §6.3 Message body length
    "head-with-length": Case(
        "6.3",
        OK + b"Content-Length: 20\r\n\r\n",
        Answered(200, b"", True),
        method=b"HEAD",
    ),
    "head-with-chunked": Case(
        "6.3", CHUNKED, Answered(200, b"", True, absent=(b"transfer-encoding",)), method=b"HEAD"
    ),
    "head-with-gzip": Case(
        "6.3", OK + b"Transfer-Encoding: gzip\r\n\r\n", Answered(200, b"", True), method=b"HEAD"
    ),
    "204-with-length": Case(
        "6.3",
        b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
        Answered(204, b"", True, absent=(b"content-length",)),
    ),
    "304-with-chunked": Case(
        "6.3",
        b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
        Answered(304, b"", True),
    ),
    "1xx-then-final": Case(
        "6.3",
        b"HTTP/1.1 100 Continue\r\nContent-Length: 5\r\n\r\n" + OK + b"Content-Length: 2\r\n\r\n{}",
        Answered(200, b"{}", True),
    ),
    "two-equal-lengths": Case(
        "6.3", OK + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}", Refused()
    ),
    "length-list": Case("6.3", OK + b"Content-Length: 2, 2\r\n\r\n{}", Refused()),
    "signed-length": Case("6.3", OK + b"Content-Length: +2\r\n\r\n{}", Refused()),
    "length-overflow": Case("6.3", OK + b"Content-Length: 99999999999999999999\r\n\r\n", Refused()),
    "closed-before-length": Case(
        "6.3", OK + b"Content-Length: 20\r\n\r\n{}", Broken(b"{}"), then=ConnectionDone
    ),
    "runs-to-close": Case(
        "6.3",
        OK + b"Content-Type: text/plain\r\n\r\nall of it",
        Answered(200, b"all of it", False),
        then=ConnectionDone,
    ),
    "runs-to-a-reset": Case("6.3", OK + b"\r\npart", Broken(b"part"), then=ConnectionLost),
    # §7.1 Chunked transfer coding
    "chunk-extensions": Case(
        "7.1.1",
        CHUNKED + b'2;name=value;q="a b"\r\n{}\r\n0;last\r\n\r\n',
        Answered(200, b"{}", True),
    ),
    "trailer-fields": Case(
        "7.1.2",
        CHUNKED + b"2\r\n{}\r\n0\r\nX-Trailer: t\r\n\r\n",
        Answered(200, b"{}", True, absent=(b"x-trailer",)),
    ),
    "framing-in-trailer": Case(
        "7.1.2", CHUNKED + b"2\r\n{}\r\n0\r\nContent-Length: 9\r\n\r\n", Broken(b"{}")
    ),
    "space-after-chunk-size": Case("7.1", CHUNKED + b"2 \r\n{}\r\n0\r\n\r\n", Broken()),
    "bare-lf-chunk-lines": Case("7.1", CHUNKED + b"2\n{}\n0\n\n", Broken()),
    "chunk-size-overflow": Case("7.1", CHUNKED + b"fffffffffffffffffff\r\n", Broken()),
    "cut-in-a-chunk": Case("7.1", CHUNKED + b"4\r\n{}", Broken(b"{}"), then=ConnectionDone),
    # §9.3 Persistence
    "close": Case(
        "9.3", OK + b"Connection: close\r\nContent-Length: 2\r\n\r\n{}", Answered(200, b"{}", False)
    ),
    "http-1.0": Case(
        "9.3", b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}", Answered(200, b"{}", False)
    ),
    "http-1.0-keep-alive": Case(
        "9.3",
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}",
        Answered(200, b"{}", True),
    ),
    "bytes-after-the-answer": Case(
        "9.3", OK + b"Content-Length: 2\r\n\r\n{}HTTP/1.1 200 OK\r\n", Answered(200, b"{}", False)
    ),
}


@pytest.mark.parametrize("name", list(CORPUS))
def test_rfc9112_response_corpus(name: str) -> None:
    case = CORPUS[name]
    rig = Rig()
    d = rig.send(case.method)
    rig.feed(case.wire)
    if case.then is not None:
        rig.lose(case.then())
    verdict = case.verdict
    got = result_of(d)
    if isinstance(verdict, Refused):
        assert isinstance(got, Failure) and got.check(ResponseNeverReceived), got
        assert rig.closing or case.then is not None
        return
    assert not isinstance(got, Failure), got
    reader = read(got)
    if isinstance(verdict, Broken):
        if case.then is None:
            rig.lose(ConnectionLost())  # the abort this client asked for
        assert reader.body == verdict.body and reader.ended_with(ResponseFailed)
        assert not rig.reused
        return
    assert (got.code, reader.body) == (verdict.status, verdict.body)
    assert reader.ended_with(ResponseDone) or reader.ended_with(PotentialDataLoss)
    assert rig.reused is verdict.reused
    for name_ in verdict.absent:
        assert not got.headers.hasHeader(name_)
