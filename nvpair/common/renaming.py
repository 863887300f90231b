"""A request body with the model it names replaced, and every other byte as the client sent it
(docs/model-names.md#the-node-gets-its-own-name).

The body is not re-serialised: key order, whitespace, escapes, number spellings and duplicate
keys would all change. The top level of the JSON object is scanned instead, the member's value
located, and only its bytes are replaced. The member is the one admission read the model from,
as the body spells it (:func:`nvpair.engines.admission.read_body`): a key spelled with escapes
(``"\\u006dodel"``) is that key, as it is to every engine's parser, and on Ollama's routes a
``"Model"`` is the model, as Go's decoder folds case. A body that names its model twice at the
top level never gets here: admission refuses it (docs/lan.md#what-a-key-can-and-cannot-do).

The scan reads the bytes where they are (:mod:`nvpair.common.jsonscan`): nothing of the body is
decoded or built but the keys that may be the one, so renaming a body costs the new body and no
more (docs/robustness.md#what-a-request-body-costs).
"""

from __future__ import annotations

import codecs
import json

from nvpair.common.jsonscan import is_key, members

__all__ = ["renamed"]

#: Non-ASCII bodies are checked as UTF-8 this many bytes at a time.
_WINDOW = 1024 * 1024


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


def renamed(body: bytes, name: str, member: str = "model") -> bytes | None:
    """``body`` with its model's name replaced by ``name``.

    :param member: the member admission read the model from, as the body spells it
        (``model``; an Ollama body's ``Model``, whose decoder folds case; ``name`` on the
        routes that take it when ``model`` names none).
    :return: the new body; None when ``body`` is no UTF-8 JSON object naming a model that way
        (the caller then sends it as it is).
    """
    if not _utf8(body):
        return None
    span: tuple[int, int] | None = None
    try:
        for key, start, end in members(body):
            if is_key(key, member):
                span = (start, end)
    except (ValueError, RecursionError):
        return None
    # A string whose spelling holds anything between its quotes holds something.
    if span is None:
        return None
    first, last = span
    if body[first : first + 1] != b'"' or last - first <= 2:
        return None
    # ASCII escapes: the new value's bytes are UTF-8 whatever the name holds (even a lone
    # surrogate, which an engine's JSON may carry as an escape). One join over views: the body
    # is copied once, into the new one.
    whole = memoryview(body)
    return b"".join((whole[:first], json.dumps(name).encode("ascii"), whole[last:]))
