"""JSON read strictly: what an engine or the broker sends is JSON text, not Python's superset.

Python's :func:`json.loads` reads more than JSON. :func:`loads` refuses what it would let
through and what we could not carry on:

- ``NaN``, ``Infinity`` and ``-Infinity`` (no such literals in JSON): re-serialized they make
  an answer no client can parse;
- a number that overflows a double (``1e400`` reads as ``inf``), for the same reason, unless
  the caller judges each field itself (``finite=False``);
- nesting past the parser's recursion limit, as a :class:`NestedTooDeeply` (a ValueError)
  rather than a RecursionError;
- on request (``lone_surrogates=False``), a string escaping a lone UTF-16 surrogate
  (``"\\ud800"``): it has no UTF-8 form, so it could not be stored, logged nor echoed back as
  the text it claims to be.

Every refusal is a ValueError, as are :func:`json.loads`' own (bad syntax, bad UTF-8, an
integer past Python's digit limit), so one ``except ValueError`` catches them all. Pure: no
I/O.
"""

from __future__ import annotations

import json
import math
import re


class NestedTooDeeply(ValueError):
    """The value nests deeper than the parser's recursion limit."""

    def __init__(self) -> None:
        super().__init__("nested too deeply")


#: A backslash-u escape of a UTF-16 surrogate (D800-DFFF). Only text containing one can decode
#: to a lone surrogate, so only such text pays for the walk that looks for one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} overflows a double")
    return value


#: Built once: :func:`json.loads` with a hook builds a decoder (and its scanner) per call, which
#: costs about as much as decoding a broker line.
_FINITE = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)
_ANY_FLOAT = json.JSONDecoder(parse_constant=_refuse_constant)


def loads(data: str | bytes, *, finite: bool = True, lone_surrogates: bool = True) -> object:
    """The JSON value of ``data``; ValueError when it is not JSON text this reader accepts.

    :param data: the text, or bytes (decoded as :func:`json.loads` decodes them: UTF-8,
        UTF-16 or UTF-32, guessed; decode first to insist on one).
    :param finite: refuse a number that overflows a double; False lets it read as an infinity.
    :param lone_surrogates: False refuses a string holding a lone surrogate escape.
    :raises NestedTooDeeply: nested past the parser's recursion limit.
    :raises ValueError: not JSON, or refused as above.
    """
    text = (
        data if isinstance(data, str) else data.decode(json.detect_encoding(data), "surrogatepass")
    )
    try:
        value = (_FINITE if finite else _ANY_FLOAT).decode(text)
    except RecursionError:
        raise NestedTooDeeply from None
    if not lone_surrogates and _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(value):
        raise ValueError("lone surrogate escape")
    return value


def _has_lone_surrogate(value: object) -> bool:
    # Iterative: the value may be nested nearly as deep as the recursion limit allows.
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
