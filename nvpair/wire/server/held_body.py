# -*- test-case-name: tests.wire.server.test_facade_server -*-
"""A request body as a facade connection holds it: what it costs is what it is
(docs/robustness.md#what-a-request-body-costs).

Pieces grow one buffer, not an object each, whatever the client's chunk sizes; the buffer is
handed on as the body's bytes without a copy; and while a JSON reader reads a large body, the
body is held as its text instead of beside it. Pure values: the request keeps the state.
"""

from __future__ import annotations

from io import BytesIO

#: A body as held: its first piece, the buffer pieces grow in, or its text.
Held = bytes | BytesIO | str

#: A body this large is handed to a JSON reader as its text, its bytes let go meanwhile
#: (:func:`as_text`); below it the bytes are read as they are.
TEXT_FROM = 1024 * 1024


def grow(body: Held, data: bytes) -> Held:
    """``body`` with ``data`` after it.

    A BytesIO grows in place (by ``realloc``, which the C library does without a copy once a
    buffer is large enough to be mapped on its own), where a bytearray's ``bytes()`` at the end
    would copy it whole.
    """
    if not body:
        return data
    if type(body) is bytes:
        grown = BytesIO()
        grown.write(body)
        grown.write(data)
        return grown
    assert isinstance(body, BytesIO)
    body.write(data)
    return body


def whole(body: Held) -> bytes:
    """The body's bytes: the buffer it grew in, shrunk to its size (no copy), or its text
    encoded again (byte for byte the same: UTF-8 decodes one way only)."""
    if type(body) is bytes:
        return body
    if isinstance(body, str):
        return body.encode("utf-8", "surrogatepass")
    assert isinstance(body, BytesIO)
    return body.getvalue()


def as_text(body: bytes) -> str | None:
    """The text a JSON reader would decode a large body to, or None where it reads the bytes
    (a small body, or one that is no JSON object in UTF-8, RFC 8259 §8.1).

    The check is the one admission's reading makes (nvpair.engines.admission): an object's
    first byte, and no NUL after it (which would be UTF-16).
    """
    if len(body) < TEXT_FROM or body[:1] != b"{" or body[1:2] == b"\0":
        return None
    try:
        return body.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None
