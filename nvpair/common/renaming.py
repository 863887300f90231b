"""A request body with the model it names replaced, and every other byte as the client sent it
(docs/model-names.md#the-node-gets-its-own-name).

The body is not re-serialised: key order, whitespace, escapes, number spellings and duplicate
keys would all change. The top level of the JSON object is scanned instead, the member's value
located, and only its bytes are replaced. The member is the one the proxy read the model from
(:func:`nvpair.engines.admission.model_from_body`): the **last** top-level ``model`` holding a
non-empty string, as every engine's parser keeps the last of duplicate keys (Go's
``encoding/json``, llama.cpp's nlohmann json, JavaScript's ``JSON.parse``, Python's ``json``);
a key spelled with escapes (``"\\u006dodel"``) is that key, as it is to them.

The scan reads the bytes where they are: nothing of the body is decoded or built but the keys
that may be the one, so renaming a body costs the new body and no more
(docs/robustness.md#what-a-request-body-costs). Each value is checked against JSON's grammar
(Python's, which admission parses with: ``NaN`` and ``Infinity`` included) by one regular
expression for values nested up to :data:`_NESTED` deep, and level by level below that.
"""

from __future__ import annotations

import codecs
import json
import re
from functools import cache

__all__ = ["renamed"]

_BOM = b"\xef\xbb\xbf"
_WS = rb"[ \t\n\r]*+"
_SPACE = re.compile(_WS)
#: What stands between a string's quotes, as Python's ``json`` reads it (strictly: no control
#: characters); bytes past ASCII are checked as UTF-8 once for the whole body. A run of plain
#: bytes, then escapes each followed by their run ("unrolled", no alternation per byte), the
#: plain bytes as ranges (not a negated class): two and a half times faster in ``re``.
_PLAIN = rb"[ !#-\[\]-\xff]*+"
_CHARS = _PLAIN + rb'(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})' + _PLAIN + b")*+"
_STRING_RE = b'"' + _CHARS + b'"'
_STRING = re.compile(_STRING_RE)
_SCALAR_RE = (
    _STRING_RE
    + rb"|-?+(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?+(?:[eE][-+]?+[0-9]++)?+"
    + rb"|true|false|null|NaN|-?Infinity"
)
#: A member's key, and the colon after it, spaces around: one match a member.
_KEY = re.compile(b'"(' + _CHARS + b')"' + _WS + b":" + _WS)
#: What follows a member's value: a comma or the object's end, spaces around.
_NEXT = re.compile(_WS + rb"([,}])" + _WS)
#: How deep one match of :func:`_value` reaches. Each level doubles the expression (Python's
#: ``re`` has no recursion); five hold a chat's messages with parts and image URLs in one match.
_NESTED = 5
#: Non-ASCII bodies are checked as UTF-8 this many bytes at a time.
_WINDOW = 1024 * 1024


def _nested(depth: int) -> bytes:
    """A JSON value nested at most ``depth`` deep. Possessive and atomic throughout: JSON is
    read left to right without ever going back, and so is this."""
    if depth == 0:
        return b"(?>" + _SCALAR_RE + b")"
    inner = _nested(depth - 1)
    # Each member is followed by a comma that is not the last thing (no trailing comma) or by
    # the end: one reference to the inner value per container, not two.
    array = rb"\[" + _WS + b"(?:" + inner + _WS + rb"(?:," + _WS + rb"(?!\])|(?=\])))*+\]"
    member = _STRING_RE + _WS + b":" + _WS + inner + _WS
    obj = rb"\{" + _WS + b"(?:" + member + rb"(?:," + _WS + rb"(?!\})|(?=\})))*+\}"
    return b"(?>" + _SCALAR_RE + b"|" + array + b"|" + obj + b")"


@cache
def _value() -> re.Pattern[bytes]:
    # Compiled once, when first used: a tenth of a second a process that renames nothing
    # would spend at start.
    return re.compile(_nested(_NESTED))


def _skip_space(body: bytes, at: int) -> int:
    end = _SPACE.match(body, at)
    assert end is not None  # "*" matches the empty string
    return end.end()


def _skip_value(body: bytes, at: int) -> int:
    """Where the JSON value at ``at`` ends; ValueError when there is none (RecursionError when
    it nests past what Python recurses through, as ``json`` would)."""
    matched = _value().match(body, at)
    if matched is not None:
        return matched.end()
    # Deeper than one match reaches (or no value): a level here, the next by the expression.
    opener = body[at : at + 1]
    if opener == b"[":
        close, keyed = b"]", False
    elif opener == b"{":
        close, keyed = b"}", True
    else:
        raise ValueError("no value")
    at = _skip_space(body, at + 1)
    if body[at : at + 1] == close:
        return at + 1
    while True:
        if keyed:
            key = _STRING.match(body, at)
            if key is None:
                raise ValueError("no key")
            at = _skip_space(body, key.end())
            if body[at : at + 1] != b":":
                raise ValueError("no colon")
            at = _skip_space(body, at + 1)
        at = _skip_space(body, _skip_value(body, at))
        ending = body[at : at + 1]
        if ending == close:
            return at + 1
        if ending != b",":
            raise ValueError("no comma")
        at = _skip_space(body, at + 1)


def _is_key(raw: bytes, key: str) -> bool:
    """Whether a key spelled ``raw`` (between its quotes) is ``key``, an ASCII name."""
    if b"\\" not in raw:
        return raw == key.encode("ascii")
    # Escapes: decoded only when short enough to be the key (\\uXXXX, six bytes a character).
    return len(raw) <= 6 * len(key) and json.loads(b'"%s"' % raw) == key


def _spans(body: bytes, wanted: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """Where the last value of each ``wanted`` member of the top-level object is: (start,
    end) byte offsets. ValueError when ``body`` is no JSON object."""
    at = _skip_space(body, len(_BOM) if body.startswith(_BOM) else 0)
    if body[at : at + 1] != b"{":
        raise ValueError("not an object")
    spans: dict[str, tuple[int, int]] = {}
    at = _skip_space(body, at + 1)
    if body[at : at + 1] == b"}":
        at = _skip_space(body, at + 1)
    else:
        while True:
            key = _KEY.match(body, at)
            if key is None:
                raise ValueError("no key and colon")
            start = key.end()
            at = _skip_value(body, start)
            raw = key.group(1)
            for member in wanted:
                if _is_key(raw, member):
                    spans[member] = (start, at)
            after = _NEXT.match(body, at)
            if after is None:
                raise ValueError("no comma")
            at = after.end()
            if after.group(1) == b"}":
                break
    if at != len(body):
        raise ValueError("more after the object")
    return spans


def _utf8(body: bytes) -> bool:
    """Whether ``body`` is UTF-8, checked a window at a time: never a decoded copy of it all."""
    if body.isascii():
        return True
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(body)
    try:
        for at in range(0, len(body), _WINDOW):
            decoder.decode(view[at : at + _WINDOW])
        decoder.decode(b"", True)
    except UnicodeDecodeError:
        return False
    return True


def renamed(body: bytes, name: str, fallback: str | None = None) -> bytes | None:
    """``body`` with its model's name replaced by ``name``.

    :param fallback: the member read when ``model`` holds no non-empty string (Ollama's
        ``name`` on the routes that take it), as admission reads it.
    :return: the new body; None when ``body`` is no UTF-8 JSON object naming a model that way
        (the caller then sends it as it is).
    """
    if not _utf8(body):
        return None
    wanted = ("model",) if fallback is None else ("model", fallback)
    try:
        spans = _spans(body, wanted)
    except (ValueError, RecursionError):
        return None
    for member in wanted:
        span = spans.get(member)
        # A string whose spelling holds anything between its quotes holds something.
        if span is not None and body[span[0] : span[0] + 1] == b'"' and span[1] - span[0] > 2:
            first, last = span
            break
    else:
        return None
    # ASCII escapes: the new value's bytes are UTF-8 whatever the name holds (even a lone
    # surrogate, which an engine's JSON may carry as an escape). One join over views: the body
    # is copied once, into the new one.
    whole = memoryview(body)
    return b"".join((whole[:first], json.dumps(name).encode("ascii"), whole[last:]))
