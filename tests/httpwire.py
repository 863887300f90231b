"""A strict reader of what a server wrote: the bytes must be a well-formed HTTP/1.x response stream.

Used by the facade tests to judge the wire, not the objects behind it; :func:`talk` is the raw
client that collects those bytes from a real listener. It follows
RFC 9112 §4-§7 for message framing (status line, field lines, message body length) and is
stricter than a client needs to be: obsolete line folding, bare LF, a field value with a
control character, a response carrying both ``Transfer-Encoding`` and ``Content-Length`` or
several different ``Content-Length`` values are all refused, since a server must never send
them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from attrs import frozen
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.interfaces import IReactorTCP, IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure

_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-9][0-9]{2}) ([\t\x20-\x7e\x80-\xff]*)")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]+)[ \t]*(;.*)?")


class Malformed(Exception):
    """The stream is not a well-formed HTTP/1.x response stream."""


@frozen
class WireResponse:
    """One response as read off the wire.

    :ivar request_index: which request (in order) this response answers; interim (1xx)
        responses share the index of the final response that follows them.
    :ivar close_delimited: the body ran to the end of the connection.
    """

    request_index: int
    status: int
    reason: bytes
    version: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    close_delimited: bool

    @property
    def interim(self) -> bool:
        return 100 <= self.status < 200

    def values(self, name: bytes) -> list[bytes]:
        """Every value of the header ``name`` (case-insensitive), in order."""
        lowered = name.lower()
        return [v for n, v in self.headers if n.lower() == lowered]

    def value(self, name: bytes) -> bytes | None:
        found = self.values(name)
        return found[0] if found else None


def _line(data: bytes, at: int) -> tuple[bytes, int]:
    end = data.find(b"\r\n", at)
    if end < 0:
        raise Malformed(f"incomplete line at byte {at}")
    line = data[at:end]
    if b"\n" in line or b"\r" in line:
        raise Malformed(f"bare CR or LF inside a line at byte {at}")
    return line, end + 2


def _fields(data: bytes, at: int) -> tuple[list[tuple[bytes, bytes]], int]:
    fields: list[tuple[bytes, bytes]] = []
    while True:
        line, at = _line(data, at)
        if not line:
            return fields, at
        if line[:1] in (b" ", b"\t"):
            raise Malformed(f"obsolete line folding: {line[:80]!r}")
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None:
            raise Malformed(f"bad field line: {line[:80]!r}")
        value = value.strip(b" \t")
        if _FIELD_VALUE.fullmatch(value) is None:
            raise Malformed(f"bad field value for {name!r}: {value[:80]!r}")
        fields.append((name, value))


def _chunked(data: bytes, at: int) -> tuple[bytes, int]:
    body = bytearray()
    while True:
        line, at = _line(data, at)
        match = _CHUNK_SIZE.fullmatch(line)
        if match is None:
            raise Malformed(f"bad chunk size line: {line[:80]!r}")
        size = int(match.group(1), 16)
        if size == 0:
            # Trailer section, then the final empty line.
            _, at = _fields(data, at)
            return bytes(body), at
        if len(data) < at + size + 2:
            raise Malformed("incomplete chunk")
        body += data[at : at + size]
        at += size
        if data[at : at + 2] != b"\r\n":
            raise Malformed("chunk data not followed by CRLF")
        at += 2


def _body_follows(data: bytes, at: int, lengths: set[bytes]) -> bool:
    """Whether a Content-Length body sits at ``at``: the declared bytes are there and what
    follows them is the end of the stream or another status line."""
    (text,) = lengths if len(lengths) == 1 else (b"",)
    if not text.isdigit():
        return True  # let the strict path report it
    end = at + int(text)
    return len(data) >= end and (end == len(data) or data[end:].startswith(b"HTTP/1."))


def read_stream(
    data: bytes, methods: Sequence[bytes | None], *, closed: bool
) -> list[WireResponse]:
    """Every response in ``data``, in order; :class:`Malformed` if any byte is out of place.

    :param methods: the method of each request, in the order sent: a response to ``HEAD``
        has no body. None when the server may not have known it (a request line it may not
        have parsed): the body is then whatever the bytes allow, with or without.
    :param closed: whether the server closed the connection after these bytes; a body
        delimited by the close is acceptable only then, and only for the last response.
    """
    responses: list[WireResponse] = []
    at = 0
    index = 0
    while at < len(data):
        line, at = _line(data, at)
        match = _STATUS_LINE.fullmatch(line)
        if match is None:
            raise Malformed(f"bad status line: {line[:80]!r}")
        status = int(match.group(1))
        version = line[:8]
        headers, at = _fields(data, at)
        lowered = [(n.lower(), v) for n, v in headers]
        lengths = {v for n, v in lowered if n == b"content-length"}
        codings = [v for n, v in lowered if n == b"transfer-encoding"]
        method = methods[index] if index < len(methods) else None
        close_delimited = False
        if 100 <= status < 200 or status in (204, 304) or method == b"HEAD":
            if 100 <= status < 200 and (lengths or codings):
                raise Malformed("an interim response with a body length")
            body = b""
        elif method is None and lengths and not _body_follows(data, at, lengths):
            # A request the server could not have parsed may have been a HEAD: no body.
            body = b""
        elif codings:
            if lengths:
                raise Malformed("both Transfer-Encoding and Content-Length")
            last = b",".join(codings).split(b",")[-1].strip().lower()
            if last != b"chunked":
                raise Malformed(f"Transfer-Encoding not ending in chunked: {codings!r}")
            body, at = _chunked(data, at)
        elif lengths:
            if len(lengths) != 1:
                raise Malformed(f"several Content-Length values: {sorted(lengths)!r}")
            (length_text,) = lengths
            if not length_text.isdigit():
                raise Malformed(f"bad Content-Length: {length_text!r}")
            length = int(length_text)
            if len(data) < at + length:
                raise Malformed(f"body shorter than its Content-Length {length}")
            body, at = data[at : at + length], at + length
        else:
            if not closed:
                raise Malformed("a body delimited by the close on an open connection")
            body, at, close_delimited = data[at:], len(data), True
        responses.append(
            WireResponse(
                index, status, match.group(2), version, tuple(headers), body, close_delimited
            )
        )
        if status >= 200:
            index += 1
    return responses


class Raw(Protocol):
    """A client that keeps every byte the server writes; ``done`` fires with them at the close."""

    def __init__(self) -> None:
        self.data = b""
        self.done: Deferred[bytes] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.done.callback(self.data)


async def talk(reactor: IReactorTCP, port: int, data: bytes, patience: float = 10.0) -> bytes:
    """Write ``data`` to a loopback listener and read until the server closes; a server that
    has not closed within ``patience`` seconds fails the call."""
    raw = Raw()
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), raw)
    assert raw.transport is not None
    raw.transport.write(data)
    raw.done.addTimeout(patience, IReactorTime(reactor))
    return await raw.done
