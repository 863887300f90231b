"""RFC 9112 (and RFC 9110's method rules) at the facade, one row per rule, through a real
listener and a raw client.

Each row is a request as a client could send it, the section it exercises, and what the facade
answers: served (the stand-in request path saw it) or refused with a status and reason. Where
the RFC leaves a choice (MAY), the row records the one the facade makes and why.
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor as _reactor

from nvpair.engines import LLAMACPP
from nvpair.facade_server import FacadeSite
from nvpair.http_facade import Facade
from tests.httpwire import read_stream, talk
from tests.test_facade_head import Recorder

reactor: Any = _reactor

SERVED = (200, None)
BAD_REQUEST = (400, "bad-request")
NOT_IMPLEMENTED = (501, "not-implemented")

#: Every row closes the connection after its answer, so the client reads to the close.
CLOSE = "Connection: close\r\n"
HOST = "Host: localhost\r\n"

CORPUS = [
    # §3: request-line = method SP request-target SP HTTP-version
    pytest.param("GET /props HTTP/1.1\r\n" + HOST + CLOSE + "\r\n", SERVED, id="3-request-line"),
    # §2.2: a server SHOULD ignore at least one empty line before the request-line.
    pytest.param(
        "\r\nGET /props HTTP/1.1\r\n" + HOST + CLOSE + "\r\n", SERVED, id="2.2-empty-line"
    ),
    # §2.2: a bare LF MAY be taken as a line end; llhttp does not, and nothing is guessed.
    pytest.param("GET /props HTTP/1.1\nHost: x\n\n", BAD_REQUEST, id="2.2-bare-lf"),
    # §2.3: only HTTP/1.x is spoken here (RFC 9110 §15.6.6 would allow 505).
    pytest.param("GET /props HTTP/2.0\r\n" + HOST + "\r\n", BAD_REQUEST, id="2.3-version"),
    # §3.2: an HTTP/1.1 request without Host, or with two, or an invalid one MUST be 400.
    pytest.param("GET /props HTTP/1.1\r\n" + CLOSE + "\r\n", BAD_REQUEST, id="3.2-no-host"),
    pytest.param("GET /props HTTP/1.1\r\n" + HOST + HOST + "\r\n", BAD_REQUEST, id="3.2-two-hosts"),
    pytest.param("GET /props HTTP/1.1\r\nHost: a b\r\n\r\n", BAD_REQUEST, id="3.2-bad-host"),
    # §3.2: an empty Host is what a target without an authority calls for.
    pytest.param("GET /props HTTP/1.1\r\nHost:\r\n" + CLOSE + "\r\n", SERVED, id="3.2-empty-host"),
    pytest.param("GET /props HTTP/1.0\r\n\r\n", SERVED, id="3.2-http-1.0-no-host"),
    # §3.2.1: origin-form has no fragment.
    pytest.param("GET /props#x HTTP/1.1\r\n" + HOST + "\r\n", BAD_REQUEST, id="3.2.1-fragment"),
    # §3.2.2: absolute-form is accepted; it is routed by its path and query.
    pytest.param(
        "GET http://localhost/props HTTP/1.1\r\n" + HOST + CLOSE + "\r\n",
        SERVED,
        id="3.2.2-absolute-form",
    ),
    # §3.2.3: authority-form is CONNECT's; no tunnel is offered.
    pytest.param(
        "CONNECT localhost:443 HTTP/1.1\r\nHost: localhost:443\r\n\r\n",
        NOT_IMPLEMENTED,
        id="3.2.3-connect",
    ),
    # §3.2.4: asterisk-form names no resource an engine has.
    pytest.param("OPTIONS * HTTP/1.1\r\n" + HOST + "\r\n", BAD_REQUEST, id="3.2.4-asterisk"),
    # §5.1: no whitespace between a field name and its colon: MUST be 400.
    pytest.param("GET /props HTTP/1.1\r\nHost : x\r\n\r\n", BAD_REQUEST, id="5.1-space-colon"),
    # §5.2: obsolete line folding: MUST be 400 (or replaced; not done).
    pytest.param(
        "GET /props HTTP/1.1\r\n" + HOST + "X-A: a\r\n b\r\n\r\n", BAD_REQUEST, id="5.2-obs-fold"
    ),
    # RFC 9110 §5.5: a NUL in a field value MUST be rejected or replaced.
    pytest.param(
        "GET /props HTTP/1.1\r\n" + HOST + "X-A: a\x00b\r\n\r\n", BAD_REQUEST, id="5.5-nul"
    ),
    # §6.1: Transfer-Encoding in HTTP/1.0 means faulty framing: refused, as nginx does.
    pytest.param(
        "POST /props HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        BAD_REQUEST,
        id="6.1-te-in-1.0",
    ),
    # §6.1: a transfer coding the server does not understand SHOULD be 501. (§6.3 asks 400 when
    # chunked is not the last coding; every coding but chunked is 501 here, as nginx has it.)
    pytest.param(
        "POST /props HTTP/1.1\r\n" + HOST + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        NOT_IMPLEMENTED,
        id="6.1-gzip-chunked",
    ),
    pytest.param(
        "POST /props HTTP/1.1\r\n" + HOST + "Transfer-Encoding: chunked, gzip\r\n\r\n",
        NOT_IMPLEMENTED,
        id="6.3-chunked-not-last",
    ),
    # §6.3: Content-Length with Transfer-Encoding ought to be handled as an error.
    pytest.param(
        "POST /props HTTP/1.1\r\n" + HOST + "Content-Length: 5\r\n"
        "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        BAD_REQUEST,
        id="6.3-length-and-coding",
    ),
    # §6.3: an invalid Content-Length MUST be 400; identical repeats MAY be accepted (are not).
    pytest.param(
        "POST /props HTTP/1.1\r\n" + HOST + "Content-Length: 1x\r\n\r\n",
        BAD_REQUEST,
        id="6.3-bad-length",
    ),
    pytest.param(
        "POST /props HTTP/1.1\r\n" + HOST + "Content-Length: 2, 2\r\n\r\nab",
        BAD_REQUEST,
        id="6.3-length-list",
    ),
    # §7.1: a chunk size is hex digits.
    pytest.param(
        "POST /props HTTP/1.1\r\n" + HOST + "Transfer-Encoding: chunked\r\n\r\nzz\r\n",
        BAD_REQUEST,
        id="7.1-bad-chunk-size",
    ),
    # §7.1.1: chunk extensions are ignored; §7.1.2: trailer fields are not merged (dropped).
    pytest.param(
        "POST /props HTTP/1.1\r\n" + HOST + CLOSE + "Transfer-Encoding: chunked\r\n\r\n"
        "2;ext=1\r\n{}\r\n0\r\nX-Trailer: t\r\n\r\n",
        SERVED,
        id="7.1-extension-and-trailer",
    ),
    # RFC 9110 §9.1: methods are case-sensitive; one the parser cannot carry SHOULD be 501.
    pytest.param("get /props HTTP/1.1\r\n" + HOST + "\r\n", NOT_IMPLEMENTED, id="9.1-lowercase"),
    pytest.param("FOO /props HTTP/1.1\r\n" + HOST + "\r\n", NOT_IMPLEMENTED, id="9.1-unknown"),
    pytest.param("PURGE /props HTTP/1.1\r\n" + HOST + CLOSE + "\r\n", SERVED, id="9.1-extension"),
    # RFC 9110 §7.8: an upgrade offer may be ignored; it is.
    pytest.param(
        "POST /props HTTP/1.1\r\n" + HOST + CLOSE + "Upgrade: h2c\r\n"
        "Connection: Upgrade, HTTP2-Settings\r\nContent-Length: 2\r\n\r\n{}",
        SERVED,
        id="7.8-upgrade-ignored",
    ),
]


@pytest.mark.parametrize(("raw", "expected"), CORPUS)
@pytest_twisted.ensureDeferred
async def test_rfc_9112_corpus(raw: str, expected: tuple[int, str | None]) -> None:
    handler = Recorder()
    port = reactor.listenTCP(
        0, FacadeSite(Facade(LLAMACPP, handler), 1024, clock=reactor), interface="127.0.0.1"
    )
    try:
        data = await talk(reactor, port.getHost().port, raw.encode("latin-1"))
    finally:
        await port.stopListening()
    (answer,) = read_stream(data, [None], closed=True)
    reason = answer.value(b"x-nvpair-error")
    assert (answer.status, None if reason is None else reason.decode()) == expected
    assert len(handler.seen) == (1 if expected == SERVED else 0)
