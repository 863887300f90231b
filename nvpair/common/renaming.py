"""A request body with the model it names replaced, and every other byte as the client sent it
(docs/model-names.md#the-node-gets-its-own-name).

The body is not re-serialised: key order, whitespace, escapes, number spellings and duplicate
keys would all change. The top level of the JSON object is scanned instead, the member's value
located, and only its bytes are replaced. The member is the one the proxy read the model from
(:func:`nvpair.engines.admission.model_from_body`): the **last** top-level ``model`` holding a
non-empty string, as every engine's parser keeps the last of duplicate keys (Go's
``encoding/json``, llama.cpp's nlohmann json, JavaScript's ``JSON.parse``, Python's ``json``);
a key spelled with escapes (``"\\u006dodel"``) is that key, as it is to them.
"""

from __future__ import annotations

import json
import re
from json.decoder import scanstring  # type: ignore[attr-defined]  # C-accelerated, untyped

__all__ = ["renamed"]

_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")


def _skip(text: str, at: int) -> int:
    end = _SPACE.match(text, at)
    assert end is not None  # "*" matches the empty string
    return end.end()


def _spans(text: str, wanted: tuple[str, ...]) -> dict[str, tuple[int, int, object]]:
    """The last value of each ``wanted`` member of the top-level object: (start, end, value),
    as character offsets into ``text``. ValueError (or IndexError) when it is no object."""
    at = _skip(text, 1 if text.startswith("\ufeff") else 0)
    if text[at] != "{":
        raise ValueError("not an object")
    spans: dict[str, tuple[int, int, object]] = {}
    at = _skip(text, at + 1)
    if text[at] == "}":
        return spans
    while True:
        if text[at] != '"':
            raise ValueError("no key")
        key, at = scanstring(text, at + 1)
        at = _skip(text, at)
        if text[at] != ":":
            raise ValueError("no colon")
        start = _skip(text, at + 1)
        value, at = _DECODER.raw_decode(text, start)
        if key in wanted:
            spans[key] = (start, at, value)
        at = _skip(text, at)
        if text[at] == "}":
            return spans
        if text[at] != ",":
            raise ValueError("no comma")
        at = _skip(text, at + 1)


def renamed(body: bytes, name: str, fallback: str | None = None) -> bytes | None:
    """``body`` with its model's name replaced by ``name``.

    :param fallback: the member read when ``model`` holds no non-empty string (Ollama's
        ``name`` on the routes that take it), as admission reads it.
    :return: the new body; None when ``body`` is no UTF-8 JSON object naming a model that way
        (the caller then sends it as it is).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    wanted = ("model",) if fallback is None else ("model", fallback)
    try:
        spans = _spans(text, wanted)
    except (ValueError, IndexError, RecursionError):
        return None
    for member in wanted:
        span = spans.get(member)
        if span is not None and isinstance(span[2], str) and span[2]:
            start, end, _ = span
            break
    else:
        return None
    if body.isascii():
        first, last = start, end
    else:
        first = len(text[:start].encode("utf-8"))
        last = first + len(text[start:end].encode("utf-8"))
    # ASCII escapes: the new value's bytes are UTF-8 whatever the name holds (even a lone
    # surrogate, which an engine's JSON may carry as an escape). One join over views: a body of
    # a megabyte is copied once, not once per "+".
    whole = memoryview(body)
    return b"".join((whole[:first], json.dumps(name).encode("ascii"), whole[last:]))
