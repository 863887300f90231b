# -*- test-case-name: tests.wire.client.test_upstream_conn -*-
"""The upstream client's framing rules, as pure functions: the bytes of a request head, and
the headers a response exposes once its own framing has been read.

Nothing here holds a connection or a reactor: :mod:`nvpair.wire.client.connection` writes what
:func:`request_head` builds and hands :func:`response_headers` the fields llhttp parsed.
"""

from __future__ import annotations

import enum
import re

from nvpair.wire.headers import connection_tokens
from nvpair.wire.message import CANONICAL, Fields, canonical

#: The most head bytes (status lines, fields, interim answers) read before the final answer's
#: head is complete; an engine must not make this process buffer without bound.
MAX_HEAD = 64 * 1024

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"[\x21-\x7e]+")

#: The body's framing is this client's to write; a caller's own would contradict it.
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})

#: Response headers Twisted's client takes out of ``response.headers`` (its
#: ``HTTPParser.CONNECTION_CONTROL_HEADERS``): removed here too, so delivery forwards exactly
#: what it did. ``Content-Length`` becomes ``length`` (except in a HEAD answer with a body).
_CONNECTION_CONTROL = frozenset(
    {
        b"content-length",
        b"connection",
        b"keep-alive",
        b"te",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-connection",
    }
)


class BadResponse(Exception):
    """The upstream's bytes are no HTTP/1.x answer this client accepts (inside
    a :class:`~nvpair.wire.message.NoAnswer`, or a body ended broken)."""


def request_head(
    method: bytes,
    target: bytes,
    host: bytes,
    fields: Fields,
    length: int | None,
    authorization: bytes | None = None,
) -> bytes:
    """The request line and header section of one request, as bytes ready to send.

    ``Host`` comes first (RFC 9110 §7.2) unless ``fields`` carries its own; ``Content-Length``
    is ``length`` when it is not None, and a caller's ``Content-Length`` or
    ``Transfer-Encoding`` is never sent. At least as strict as Twisted's ``Request``: the method
    must be a token, the target visible ASCII, names tokens, and no value may hold CR, LF or
    NUL.

    :param authorization: the server's own credential: sent as ``Authorization`` in place of
        any the fields carry, and of any ``X-Api-Key``, a key in Anthropic's field: the
        server sees its own key and no other (docs/fleet-scheduling.md#node-credentials).
    :raises ValueError: for anything that would not be a well-formed head.
    """
    if method not in _METHODS:
        if _TOKEN.fullmatch(method) is None:
            raise ValueError(f"invalid method {method!r}")
        _remember(_METHODS, method)
    if target not in _TARGETS:
        if _TARGET.fullmatch(target) is None:
            raise ValueError(f"invalid request target {target!r}")
        _remember(_TARGETS, target)
    lines: list[bytes] = []
    hosts = 0
    for name, values in fields.items():
        kind = _NAMES.get(name)
        if kind is None:
            kind = _name_kind(name)
        if kind is not _Name.SEND:
            if kind is _Name.SKIP or (kind is _Name.AUTH and authorization is not None):
                continue
            if kind is _Name.HOST:
                hosts += len(values)
        for value in values:
            lines += (name, b": ", value, b"\r\n")
    if authorization is not None:
        lines += (b"Authorization", b": ", authorization, b"\r\n")
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    if not hosts:
        parts += (b"Host: ", host, b"\r\n")
    elif hosts != 1:
        raise ValueError("exactly one Host header is required")
    parts += lines
    if length is not None:
        parts.append(b"Content-Length: %d\r\n" % length)
    parts.append(b"\r\n")
    head = b"".join(parts)
    # Every line break in the head is one this function wrote, a CR and an LF each: a CR, LF or
    # NUL from a value (or the host) would show as one too many, so one pass that drops all
    # three checks every value at once.
    breaks = len(lines) // 4 + (2 if not hosts else 1) + (length is not None) + 1
    if len(head) - len(head.translate(None, b"\r\n\0")) != 2 * breaks:
        raise ValueError("a header value (or the host) holds CR, LF or NUL")
    return head


#: Methods and request targets found well formed before: judged again by a set lookup rather
#: than a regex (a request's target is checked on every attempt).
_METHODS: set[bytes] = set()
_TARGETS: set[bytes] = set()
#: Past this many, a set starts again: a client inventing targets cannot grow it.
_MAX_KNOWN = 1024


def _remember(known: set[bytes], value: bytes) -> None:
    if len(known) >= _MAX_KNOWN:
        known.clear()
    known.add(value)


class _Name(enum.Enum):
    SEND = "send"
    HOST = "host"
    SKIP = "skip"
    #: Sent unless the server has a credential of its own: ``Authorization``, ``X-Api-Key``.
    AUTH = "auth"


#: The fields a caller's key comes in, which a server's own credential replaces.
_CALLER_KEYS = frozenset({b"authorization", b"x-api-key"})

#: Verdicts on header names seen before (names repeat: Headers canonicalizes them).
_NAMES: dict[bytes, _Name] = {}


def _name_kind(name: bytes) -> _Name:
    if _TOKEN.fullmatch(name) is None:
        raise ValueError(f"invalid header name {name!r}")
    lowered = name.lower()
    if lowered in _FRAMING:
        kind = _Name.SKIP
    elif lowered == b"host":
        kind = _Name.HOST
    else:
        kind = _Name.AUTH if lowered in _CALLER_KEYS else _Name.SEND
    if len(_NAMES) >= 1024:
        _NAMES.clear()
    _NAMES[name] = kind
    return kind


#: The same names as ``Headers`` spells them: an answer's names are looked up canonical.
_CONTROL_NAMES = frozenset(canonical(name) for name in _CONNECTION_CONTROL)

#: ``Connection`` tokens that name no header this answer could carry past the removal above.
_OPTIONS = frozenset({b"close", b"keep-alive"})


def answer_head(
    fields: list[tuple[bytes, bytes]], head: bool, nothing: bool, http10: bool
) -> tuple[Fields, int | None, bool, bool]:
    """What a final answer's head says, from the fields llhttp accepted (it refuses
    ``Content-Length`` with ``Transfer-Encoding``, and a ``Content-Length`` that is not one
    number), read in one pass (RFC 9112 §6.3, §9.3).

    The headers exposed lose what Twisted's client removes (its connection-control headers,
    ``Content-Length`` becoming the length) and what ``Connection`` names (RFC 9110 §7.6.1),
    which nobody downstream could tell apart once ``Connection`` itself is gone.

    :param head: it answers a HEAD: no body, whatever its headers say (llhttp knows no HEAD),
        and its ``Content-Length``, the body a GET would get, is kept.
    :param nothing: a 204 or 304: no body, and no ``Content-Length`` (RFC 9110 §8.6).
    :param http10: it is HTTP/1.0 (keep-alive only when it asks for it).
    :returns: the fields it exposes; its body's length (0 without a body, else the
        ``Content-Length`` or None); whether the body runs to the close; whether
        the connection may carry another exchange afterwards.
    :raises BadResponse: for a body in a transfer coding other than chunked alone, which
        this client never offers (it sends no ``TE``).
    """
    # The exposed fields are made here directly (docs/performance.md#headers): names canonical,
    # values as llhttp gave them (it refuses a CR or LF in one).
    exposed = Fields()
    tokens: set[bytes] = set()
    length: int | None = None
    codings: list[bytes] | None = None
    for name, value in fields:
        key = CANONICAL.get(name)
        if key is None:
            key = canonical(name)
        if key not in _CONTROL_NAMES:
            # llhttp strips the leading whitespace of a value but keeps the trailing.
            exposed.setdefault(key, []).append(value.rstrip(b" \t"))
        elif key == b"Connection":
            tokens |= connection_tokens((value,))
        elif key == b"Content-Length":
            length = int(value)
            if head and not nothing:
                exposed.setdefault(key, []).append(value.rstrip(b" \t"))
        elif key == b"Transfer-Encoding":
            if codings is None:
                codings = []
            # Spaces only: llhttp takes ``chunked`` followed by a tab for another coding, so
            # stripping the tab here would frame the body one way and relay it another.
            codings += (c.strip(b" ").lower() for c in value.split(b",") if c.strip(b" "))
    for token in tokens:
        if token not in _OPTIONS:
            exposed.pop(canonical(token), None)
    to_close = False
    if head or nothing:
        length = 0
    elif codings is not None:
        if codings != [b"chunked"]:
            # Passed on, the body would reach the client still coded and with nothing saying
            # so (the coding belongs to this hop); nor could chunked be told from its content.
            shown = b", ".join(codings).decode("latin-1")
            raise BadResponse(f"transfer coding {shown!r} was not offered")
    elif length is None:
        to_close = True
    # An HTTP/1.0 answer with Transfer-Encoding has faulty framing: read, then closed
    # (RFC 9112 §6.1).
    keep_alive = not to_close and (
        b"keep-alive" in tokens and codings is None if http10 else b"close" not in tokens
    )
    return exposed, length, to_close, keep_alive
