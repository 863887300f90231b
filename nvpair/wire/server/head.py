# -*- test-case-name: tests.wire.server.test_facade_head -*-
"""HTTP/1.1's own rules for a request head at a facade, and the refusals they give.

What llhttp read of a head is judged here: the version, ``Host``, the transfer coding, the
target's form, the method, and what llhttp's own errors mean. Nothing here knows an engine or
the connection: what a facade decides about the client is asked of its
:class:`~nvpair.wire.server.types.Gate`, and when a refusal is answered is the connection's
(docs/robustness.md#refusals-at-the-request-head).
"""

from __future__ import annotations

import re
from typing import Protocol
from urllib.parse import urlsplit

from attrs import frozen
from httptools.parser.errors import (
    HttpParserError,
    HttpParserInvalidMethodError,
    HttpParserInvalidURLError,
)
from httptools.parser.parser import HttpRequestParser

from nvpair.common.reasons import Reason
from nvpair.wire.message import RequestHead

#: Request line plus headers, as twisted.web bounds them: past this a head is 400. Trailer
#: fields, and chunk framing that carries no body byte, get the same bound.
MAX_HEAD_BYTES = 16 * 1024

#: ``FacadeRequest.declared`` for a chunked body.
CHUNKED = -1

#: RFC 9112 §3.2's Host: uri-host [ ":" port ], an IP literal in brackets or a reg-name (which
#: covers IPv4 addresses); empty when the target has no authority.
_HOST = re.compile(rb"(?:\[[0-9A-Za-z:.%~_-]+\]|[0-9A-Za-z!$&'()*+,;=%._~-]*)(?::[0-9]*)?")

#: RFC 9110 §5.6.2's token, which a method is (RFC 9110 §9.1).
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


@frozen
class Refusal:
    """Why a request is not served: the proxy's reason and, when the reason's own message
    would not say it, what was wrong (fixed text, never request content).

    :ivar headers: header fields the answer carries besides its own (``WWW-Authenticate``,
        ``Retry-After``).
    """

    reason: Reason
    message: str | None = None
    headers: tuple[tuple[bytes, bytes], ...] = ()


HEAD_TOO_LARGE = Refusal(Reason.BAD_REQUEST, "the request line and headers are over 16 KiB")
FRAMING_TOO_LARGE = Refusal(
    Reason.BAD_REQUEST, "the chunked body's framing or trailer fields are over 16 KiB"
)
BAD_VERSION = Refusal(Reason.BAD_REQUEST, "only HTTP/1.0 and HTTP/1.1 are served")
OBS_FOLD = Refusal(Reason.BAD_REQUEST, "a header field is folded onto the next line (obs-fold)")
NOT_A_REQUEST_LINE = Refusal(
    Reason.BAD_REQUEST, "the request line is not a method, a target and an HTTP version"
)
NO_HOST = Refusal(Reason.BAD_REQUEST, "an HTTP/1.1 request must carry a Host header")
SEVERAL_HOSTS = Refusal(Reason.BAD_REQUEST, "a request must carry one Host header, not several")
BAD_HOST = Refusal(Reason.BAD_REQUEST, "the Host header is not a host with an optional port")
FRAMING_IN_1_0 = Refusal(Reason.BAD_REQUEST, "an HTTP/1.0 request cannot carry Transfer-Encoding")
BAD_TARGET = Refusal(
    Reason.BAD_REQUEST,
    "a target must be in origin form (/path) or absolute form (http://host/path)",
)
NOT_CHUNKED = Refusal(
    Reason.NOT_IMPLEMENTED, "the only request transfer coding implemented is chunked"
)
UNKNOWN_METHOD = Refusal(
    Reason.NOT_IMPLEMENTED, "the request method is not one this proxy can carry"
)
NO_TUNNEL = Refusal(Reason.NOT_IMPLEMENTED, "CONNECT is not served: this is no forward proxy")
TOO_LARGE = Refusal(Reason.BODY_TOO_LARGE)
#: The request bodies held at once would pass ``--max-body-memory``. A body held is let go
#: as soon as its request is answered: a few seconds is time enough to try again.
OVERLOADED = Refusal(Reason.OVERLOADED, headers=((b"Retry-After", b"5"),))
INTERNAL = Refusal(Reason.INTERNAL)

#: llhttp's reasons for a transfer coding it will not frame (RFC 9112 §6.3: chunked not last).
_CODING_ERRORS = frozenset(
    {"Invalid `Transfer-Encoding` header value", "Request has invalid `Transfer-Encoding`"}
)
#: llhttp's reasons for a method it knows but will not carry in HTTP/1.x: RTSP's (``DESCRIBE``,
#: ``SETUP``...), and ``PRI`` anywhere but in HTTP/2's connection preface.
_METHOD_ERRORS = frozenset(
    {"Invalid method for HTTP/x.x request", "Expected HTTP/2 Connection Preface"}
)
#: llhttp's reason for a line that begins with whitespace inside a head: a field folded onto it
#: (RFC 9112 §5.2).
_FOLDED = "Unexpected whitespace after header value"
#: llhttp's reason for HTTP/2's connection preface (``PRI * HTTP/2.0``, a client with prior
#: knowledge).
_PREFACE = "Pause on PRI/Upgrade"


def parse_refusal(error: HttpParserError, start: bytes | None = None) -> Refusal:
    """The refusal for bytes llhttp rejected, naming what it found wrong (its reasons are
    fixed text).

    :param start: the bytes the refused request begins with, when they are known (the read
        that held them began between requests): llhttp refuses a method it does not know and
        bytes that are no method alike, and only the first are 501.
    """
    if isinstance(error, HttpParserInvalidMethodError):
        if start is not None and _TOKEN.fullmatch(start.lstrip(b"\r\n").split(b" ", 1)[0]) is None:
            return NOT_A_REQUEST_LINE
        return UNKNOWN_METHOD
    if isinstance(error, HttpParserInvalidURLError):
        return BAD_TARGET
    reason = str(error)
    if reason in _CODING_ERRORS:
        return NOT_CHUNKED
    if reason in _METHOD_ERRORS:
        return UNKNOWN_METHOD
    if reason == _FOLDED:
        return OBS_FOLD
    if reason == _PREFACE:
        return BAD_VERSION
    return Refusal(Reason.BAD_REQUEST, f"malformed request: {reason}")


def origin_form(target: bytes) -> bytes | None:
    """The request target as ``/path?query``, or None when it is neither form a proxy accepts.

    Origin form (``/api/chat``) is returned as it is. Absolute form
    (``http://127.0.0.1:11435/api/chat?x=1``, RFC 9112 §3.2.2) is reduced to its path and
    query: the upstream URL is always a node's base URL plus these, never client bytes
    appended to a host. Asterisk and authority forms, a fragment, and anything else, are None.
    """
    if target.startswith(b"/"):
        return None if b"#" in target else target
    if not target[:8].lower().startswith((b"http://", b"https://")):
        return None
    try:
        parts = urlsplit(target.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not parts.netloc or parts.fragment:
        return None
    path = parts.path or "/"
    if not path.startswith("/"):
        return None
    return (path + ("?" + parts.query if parts.query else "")).encode("ascii")


class Head(Protocol):
    """What the rules read of a parsed request, and what they set on it."""

    #: As read; its fields are read here directly, its version and target set.
    head: RequestHead
    path: bytes
    keep_alive: bool
    declared: int
    expects_continue: bool


def http_refusal(request: Head, parser: HttpRequestParser) -> Refusal | None:
    """HTTP's own reason to refuse a parsed head, or None; on the way, the request's version,
    whether it keeps the connection alive, and the body length it declares are set.

    :param parser: the llhttp parser that has just read the head.
    """
    version = parser.get_http_version()
    head = request.head
    if version == "1.0":
        head.version = b"HTTP/1.0"
    elif version != "1.1":
        # llhttp reads any single-digit version; a facade speaks HTTP/1.x only.
        return BAD_VERSION
    # HTTP/1.0 connections are not kept alive, as twisted.web did before: one answer each.
    request.keep_alive = version == "1.1" and parser.should_keep_alive()
    fields = head.fields
    codings = fields.get(b"Transfer-Encoding")
    if codings:
        if version == "1.0":
            # RFC 9112 §6.1: its framing is to be taken as faulty; nginx refuses it too.
            return FRAMING_IN_1_0
        # llhttp decodes chunked, and would let another coding before it through as body.
        if len(codings) != 1 or codings[0].strip().lower() != b"chunked":
            return NOT_CHUNKED
        request.declared = CHUNKED
    else:
        lengths = fields.get(b"Content-Length")
        if lengths:
            # llhttp has already refused a malformed or conflicting length.
            request.declared = int(lengths[0])
    hosts = fields.get(b"Host")
    if not hosts:
        if version == "1.1":
            return NO_HOST
    elif len(hosts) > 1:
        return SEVERAL_HOSTS
    elif _HOST.fullmatch(hosts[0]) is None:
        return BAD_HOST
    if head.method == b"CONNECT":
        return NO_TUNNEL
    if origin_form(head.target) is None:
        return BAD_TARGET
    return None


def admit_head(request: Head) -> None:
    """A head that passed every check: its target in origin form (what is sent on, never a
    client's host), its path, and whether its client waits for ``100 Continue`` before it
    sends the body."""
    head = request.head
    target = origin_form(head.target)
    assert target is not None
    head.target = target
    request.path = target.split(b"?", 1)[0]
    expect = head.fields.get(b"Expect")
    if expect and head.version == b"HTTP/1.1" and b"100-continue" in expect[0].lower():
        request.expects_continue = True
