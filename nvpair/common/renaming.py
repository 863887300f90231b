"""A request body with the model it names replaced, and every other byte as the client sent it
(docs/model-names.md#the-node-gets-its-own-name).

The body is not re-serialised: key order, whitespace, escapes, number spellings and duplicate
keys would all change. The top level of the JSON object is scanned instead, the member's value
located, and only its bytes are replaced. The member is the one admission read the model from,
as the body spells it (:func:`nvpair.engines.admission.read_body`): a key spelled with escapes
(``"\\u006dodel"``) is that key, as it is to every engine's parser, and on Ollama's routes a
``"Model"`` is the model, as Go's decoder folds case. A body that names its model twice at the
top level never gets here: admission refuses it (docs/lan.md#what-a-key-can-and-cannot-do).
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


def renamed(body: bytes, name: str, member: str = "model") -> bytes | None:
    """``body`` with its model's name replaced by ``name``.

    :param member: the member admission read the model from, as the body spells it
        (``model``; an Ollama body's ``Model``, whose decoder folds case; ``name`` on the
        routes that take it when ``model`` names none).
    :return: the new body; None when ``body`` is no UTF-8 JSON object naming a model that way
        (the caller then sends it as it is).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    try:
        spans = _spans(text, (member,))
    except (ValueError, IndexError, RecursionError):
        return None
    span = spans.get(member)
    if span is None or not isinstance(span[2], str) or not span[2]:
        return None
    start, end, _ = span
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
