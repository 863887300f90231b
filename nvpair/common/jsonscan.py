"""The top level of a JSON object read where it lies, in its bytes or its text: each member's
key and where its value begins and ends, with nothing decoded or built but the keys asked about
(docs/robustness.md#what-a-request-body-costs).

Python's ``json`` builds the whole document to say any of that, and a document costs its body
again, or many times it (an array of numbers). Renaming a body's model
(:mod:`nvpair.common.renaming`) and finding a member named twice
(:mod:`nvpair.engines.admission`) need only the top level. Each value is checked against
JSON's grammar as Python's ``json`` reads it (strict strings; ``NaN`` and ``Infinity``) by one
regular expression for values nested up to :data:`_NESTED` deep, and level by level below that.
Bytes past ASCII are not checked as UTF-8 here: the caller knows whether they were.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from typing import Any

__all__ = ["Body", "is_key", "members"]

#: A body as scanned: its bytes, or its text.
Body = bytes | str

#: How deep one match of the value expression reaches. Each level doubles the expression
#: (Python's ``re`` has no recursion); five hold a chat's messages with parts and image URLs.
_NESTED = 5

_WS = r"[ \t\n\r]*+"
_NUMBER = r"-?+(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?+(?:[eE][-+]?+[0-9]++)?+"
_LITERAL = r"true|false|null|NaN|-?Infinity"


def _chars(plain: str) -> str:
    """What stands between a string's quotes (no control character, escapes as JSON spells
    them): a run of ``plain`` characters, then escapes each followed by their run ("unrolled":
    no alternation per character)."""
    return f"{plain}*+" + r'(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})' + f"{plain}*+)*+"


#: A string's plain characters, in bytes as ranges (two and a half times faster in ``re`` than
#: the negated class, whose bytes past ASCII the caller checks as UTF-8), in text as the negated
#: class (ranges up to U+10FFFF took ``re`` half a second to compile, and match slower).
_PLAIN_BYTES = r"[ !#-\[\]-\xff]"
_PLAIN_TEXT = r'[^"\\\x00-\x1f]'


def _nested(string: str, depth: int) -> str:
    """A JSON value nested at most ``depth`` deep. Possessive and atomic throughout: JSON is
    read left to right without ever going back, and so is this."""
    scalar = f"{string}|{_NUMBER}|{_LITERAL}"
    if depth == 0:
        return f"(?>{scalar})"
    inner = _nested(string, depth - 1)
    # Each member is followed by a comma that is not the last thing (no trailing comma) or by
    # the end: one reference to the inner value per container, not two.
    array = rf"\[{_WS}(?:{inner}{_WS}(?:,{_WS}(?!\])|(?=\])))*+\]"
    member = f"{string}{_WS}:{_WS}{inner}{_WS}"
    obj = rf"\{{{_WS}(?:{member}(?:,{_WS}(?!\}})|(?=\}})))*+\}}"
    return f"(?>{scalar}|{array}|{obj})"


class _Grammar:
    """The expressions, compiled for bytes or for text.

    :param bom: a byte order mark as the body would hold it (which Python's ``json`` skips).
    :param plain: what a string's plain characters are.
    """

    def __init__(self, text: bool, bom: str, plain: str) -> None:
        def pattern(source: str) -> re.Pattern[Any]:
            return re.compile(source if text else source.encode("latin-1"))

        chars = _chars(plain)
        self.pattern = pattern
        self.string = f'"{chars}"'
        self.space = pattern(_WS)
        self.start = pattern(f"(?:{bom})?{_WS}" + r"\{" + _WS)
        #: A member's key (group 1, between its quotes) and the colon after it.
        self.key = pattern(f'"({chars})"{_WS}:{_WS}')
        #: What may follow a value in an object or an array: a comma or its end (group 1).
        self.in_object = pattern(_WS + r"([,}])" + _WS)
        self.in_array = pattern(_WS + r"([,\]])" + _WS)
        self.object_end = pattern(r"\}")
        self.array_end = pattern(r"\]")
        self.opener = pattern(r"([\[{])" + _WS)


@cache
def _value(grammar: _Grammar) -> re.Pattern[Any]:
    """A value, nested up to :data:`_NESTED` deep. Compiled once, when first used: a tenth of
    a second a process that scans nothing would spend at its start."""
    return grammar.pattern(_nested(grammar.string, _NESTED))


_BYTES = _Grammar(False, "\xef\xbb\xbf", _PLAIN_BYTES)
_TEXT = _Grammar(True, "\ufeff", _PLAIN_TEXT)


def _skip_value(grammar: _Grammar, body: Body, at: int) -> int:
    """Where the JSON value at ``at`` ends; ValueError when there is none (RecursionError when
    it nests past what Python recurses through, as ``json`` would)."""
    matched = _value(grammar).match(body, at)
    if matched is not None:
        end: int = matched.end()
        return end
    # Deeper than one match reaches (or no value): a level here, the next by the expression.
    opened = grammar.opener.match(body, at)
    if opened is None:
        raise ValueError("no value")
    keyed = opened.group(1) in ("{", b"{")
    at = opened.end()
    if (grammar.object_end if keyed else grammar.array_end).match(body, at):
        return at + 1
    following = grammar.in_object if keyed else grammar.in_array
    while True:
        if keyed:
            key = grammar.key.match(body, at)
            if key is None:
                raise ValueError("no key and colon")
            at = key.end()
        after = following.match(body, _skip_value(grammar, body, at))
        if after is None:
            raise ValueError("no comma")
        if after.group(1) not in (",", b","):
            return int(after.start(1)) + 1
        at = after.end()


def members(body: Body) -> Iterator[tuple[Body, int, int]]:
    """Each member of the JSON object ``body`` holds, in order: its key as spelled between its
    quotes, and where its value begins and ends. ValueError, once the members before it were
    given, where ``body`` turns out to be no JSON object (RecursionError: nested past what
    Python recurses through, as ``json`` would)."""
    grammar = _TEXT if isinstance(body, str) else _BYTES
    opened = grammar.start.match(body)
    if opened is None:
        raise ValueError("not an object")
    at: int = opened.end()
    if grammar.object_end.match(body, at):
        spaces = grammar.space.match(body, at + 1)
        assert spaces is not None  # "*" matches the empty string
        at = spaces.end()
    else:
        while True:
            key = grammar.key.match(body, at)
            if key is None:
                raise ValueError("no key and colon")
            start: int = key.end()
            at = _skip_value(grammar, body, start)
            yield key.group(1), start, at
            after = grammar.in_object.match(body, at)
            if after is None:
                raise ValueError("no comma")
            at = after.end()
            if after.group(1) in ("}", b"}"):
                break
    if at != len(body):
        raise ValueError("more after the object")


def is_key(raw: Body, key: str) -> bool:
    """Whether a key spelled ``raw`` (between its quotes, as :func:`members` gives it) is
    ``key``: decoded only when it holds an escape and is short enough to be it."""
    if isinstance(raw, bytes):
        if b"\\" not in raw:
            return raw == key.encode("utf-8", "surrogatepass")
        # \\uXXXX\\uXXXX: twelve bytes a character at the most.
        return len(raw) <= 12 * len(key) and json.loads(b'"%s"' % raw) == key
    if "\\" not in raw:
        return raw == key
    return len(raw) <= 12 * len(key) and json.loads(f'"{raw}"') == key
