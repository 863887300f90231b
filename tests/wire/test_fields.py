# -*- test-case-name: tests.wire.test_fields -*-
"""``LeanHeaders`` (:mod:`nvpair.wire.fields`) is Twisted's ``Headers`` to every caller: the
same calls, driven side by side on both with generated names and values, give the same answers,
the same names in the same order, the same errors, and each compares equal to the other."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.web.http_headers import Headers, InvalidHeaderName

from nvpair.wire import fields
from nvpair.wire.fields import LeanHeaders, canonical
from nvpair.wire.message import Fields

# Names in every case, with Twisted's special capitalizations among them, as bytes and as str.
_WORDS = ["content-type", "te", "www-authenticate", "x-xss-protection", "etag", "host", "x-a-b"]
_NAME = st.one_of(
    st.sampled_from(_WORDS).flatmap(
        lambda word: st.sampled_from([word, word.upper(), word.title(), word.capitalize()])
    ),
    st.from_regex(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,12}", fullmatch=True),
).flatmap(lambda name: st.sampled_from([name, name.encode("latin-1")]))
_BAD_NAME = st.sampled_from([b"", b"a b", b"x:y", b"n\x00", "\u00e9t\u00e9", b"a\r\nb"])
# Values with line breaks of every kind, and text beyond latin-1.
_VALUE = st.one_of(
    st.binary(max_size=12),
    st.sampled_from([b"a\r\nb", b"a\nb\rc", b"\r\n", b"", b" x "]),
    st.text(max_size=8),
)

_OPERATION = st.one_of(
    st.tuples(st.just("addRawHeader"), _NAME, _VALUE),
    st.tuples(st.just("setRawHeaders"), _NAME, st.lists(_VALUE, max_size=3)),
    st.tuples(st.just("removeHeader"), _NAME),
    st.tuples(st.just("hasHeader"), _NAME),
    st.tuples(st.just("getRawHeaders"), _NAME),
    st.tuples(st.just("getRawHeaders"), _NAME, st.just("default")),
    st.tuples(st.just("addRawHeader"), _BAD_NAME, _VALUE),
    st.tuples(st.just("hasHeader"), _BAD_NAME),
)


def _outcome(headers: Headers, operation: tuple[Any, ...]) -> object:
    method, *arguments = operation
    try:
        result = getattr(headers, method)(*arguments)
    except (InvalidHeaderName, UnicodeError) as error:
        # Headers decodes a str name's values as UTF-8: bytes that are not fail alike.
        return ("raised", type(error), error.args)
    return list(result) if isinstance(result, list) else result


@settings(max_examples=200, deadline=None)
@given(st.lists(_OPERATION, max_size=12))
def test_every_call_answers_as_twisteds_headers(operations: list[tuple[Any, ...]]) -> None:
    twisted, lean = Headers(), LeanHeaders()
    for operation in operations:
        assert _outcome(lean, operation) == _outcome(twisted, operation), operation
        assert list(lean.getAllRawHeaders()) == list(twisted.getAllRawHeaders())
    assert lean == twisted
    assert twisted == lean
    assert not lean != twisted  # noqa: SIM202 (Headers' own __ne__ is the one under test)
    copied = lean.copy()
    assert isinstance(copied, LeanHeaders)
    assert copied == twisted
    copied.addRawHeader(b"x-added", b"1")
    assert copied != lean
    assert list(lean.getAllRawHeaders()) == list(twisted.getAllRawHeaders())


def test_built_from_a_mapping_as_twisteds_headers() -> None:
    raw = {b"content-TYPE": [b"a", b"b\r\nc"], b"te": [b"trailers"]}
    assert list(LeanHeaders(raw).getAllRawHeaders()) == list(Headers(raw).getAllRawHeaders())
    text = {"X-Text": ["caf\u00e9"]}
    assert LeanHeaders(text).getRawHeaders("x-text") == Headers(text).getRawHeaders("x-text")


def test_every_public_method_of_headers_is_its_own() -> None:
    """The base class's storage is never set: a method it inherited would fail on first use. A
    Twisted that adds a method to ``Headers`` fails here until LeanHeaders has it too."""
    inherited = {
        name
        for name, member in inspect.getmembers(Headers, inspect.isfunction)
        if (not name.startswith("_") or name in {"__repr__", "__cmp__", "__init__"})
        and name not in vars(LeanHeaders)
    }
    # __eq__, __lt__ and the others come from twisted's @comparable and call __cmp__.
    assert inherited <= {"__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"}


def test_a_name_is_learned_once_and_the_names_kept_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fields, "CANONICAL", {})
    monkeypatch.setattr(fields, "_MAX_NAMES", 3)
    assert canonical(b"content-md5") == b"Content-MD5"
    assert canonical("x-one") == b"X-One"
    assert canonical(b"x-two") == b"X-Two"
    assert len(fields.CANONICAL) == 3
    # A fourth name starts the cache again rather than growing it.
    assert canonical(b"x-three") == b"X-Three"
    assert fields.CANONICAL == {b"x-three": b"X-Three"}
    with pytest.raises(InvalidHeaderName):
        canonical(b"not a token")


def test_the_headers_over_fields_are_those_fields() -> None:
    fields_ = Fields({b"Content-Type": [b"a"]})
    headers = LeanHeaders.over(fields_)
    headers.addRawHeader(b"x-one", b"1")
    assert fields_ == {b"Content-Type": [b"a"], b"X-One": [b"1"]}
    fields_[b"Host"] = [b"h"]
    assert headers.getRawHeaders(b"host") == [b"h"]
    assert headers == Headers({b"content-type": [b"a"], b"x-one": [b"1"], b"host": [b"h"]})
