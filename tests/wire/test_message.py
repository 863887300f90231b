"""The HTTP types of :mod:`nvpair.wire.message`: field names spelled as heads keep them, fields
read in any case, and how a body ended."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.web.http_headers import Headers

from nvpair.wire.message import (
    AT_CLOSE,
    CANONICAL,
    COMPLETE,
    End,
    Ended,
    Fields,
    InvalidName,
    canonical,
)

_TOKEN_CHARS = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


@given(st.text(alphabet=_TOKEN_CHARS, min_size=1, max_size=40))
def test_names_are_spelled_as_twisted_spells_them(name: str) -> None:
    # What clients and tests saw before this module owned the rule.
    probe = Headers()
    probe.addRawHeader(name.encode(), b"")
    ((expected, _),) = probe.getAllRawHeaders()
    CANONICAL.clear()
    assert canonical(name.encode()) == expected
    assert canonical(name) == expected


@pytest.mark.parametrize("name", [b"", b"a b", b"x:y", b"caf\xc3\xa9", b"a\r\nb", "名前", "café"])
def test_a_name_that_is_no_token_is_refused(name: bytes | str) -> None:
    with pytest.raises(InvalidName):
        canonical(name)


def test_fields_are_read_in_any_case_and_kept_in_order() -> None:
    fields = Fields.of([(b"content-type", b"a"), (b"X-One", b"1"), (b"x-one", b"2")])
    assert list(fields) == [b"Content-Type", b"X-One"]
    assert fields.all_of("X-ONE") == [b"1", b"2"]
    assert fields.first(b"x-one") == b"1"
    assert fields.last(b"x-one") == b"2"
    assert fields.has(b"CONTENT-TYPE")
    assert fields.first(b"absent") is None
    assert fields.all_of(b"absent") == []
    fields.put(b"x-one", b"3")
    assert fields[b"X-One"] == [b"3"]
    fields.drop(b"X-ONE")
    assert not fields.has(b"x-one")
    fields.drop(b"x-one")  # absent: nothing to do


def test_a_copy_shares_no_list() -> None:
    fields = Fields.of({b"a": [b"1"]})
    copied = fields.copy()
    copied.add(b"a", b"2")
    assert fields.all_of(b"a") == [b"1"]
    assert isinstance(copied, Fields)


def test_lowered_is_what_pure_modules_read() -> None:
    fields = Fields.of([(b"Access-Control-Allow-Origin", b"*")])
    assert fields.lowered() == {b"access-control-allow-origin": [b"*"]}


@pytest.mark.parametrize("value", [b"a\r\nX-Injected: 1", b"a\nb", b"a\0b", "a\rb"])
def test_a_value_that_would_break_the_head_is_refused(value: bytes | str) -> None:
    fields = Fields()
    with pytest.raises(ValueError, match="CR, LF or NUL"):
        fields.put(b"x", value)
    with pytest.raises(ValueError, match="CR, LF or NUL"):
        fields.add(b"x", value)
    assert fields == {}


def test_text_values_are_utf8() -> None:
    fields = Fields()
    fields.put("X-Name", "é")
    assert fields[b"X-Name"] == ["é".encode()]


def test_which_ends_are_complete() -> None:
    assert COMPLETE.complete and AT_CLOSE.complete
    assert not Ended(End.CUT, ConnectionResetError()).complete
    assert not Ended(End.BROKEN).complete
    assert {end for end in End if Ended(end).complete} == {End.COMPLETE, End.AT_CLOSE}
