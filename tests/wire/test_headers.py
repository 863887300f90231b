# -*- test-case-name: tests.wire.test_headers -*-
"""Hop-by-hop removal in place (:func:`nvpair.wire.headers.strip_hop_by_hop`) keeps exactly what
:func:`~nvpair.wire.headers.end_to_end` keeps, in the same order, on Twisted's ``Headers`` and on
``LeanHeaders`` alike, whatever case the names come in and whatever ``Connection`` lists."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.web.http_headers import Headers

from nvpair.wire.fields import LeanHeaders
from nvpair.wire.headers import end_to_end, strip_hop_by_hop

_NAMES = [
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
    "proxy-connection",
    "host",
    "content-length",
    "expect",
    "content-type",
    "x-custom",
    "authorization",
]
_NAME = st.sampled_from(_NAMES).flatmap(
    lambda name: st.sampled_from([name, name.upper(), name.title()]).map(str.encode)
)
# Connection's values list names (some of them here), options, and things no header is called.
_LISTED = st.lists(
    st.sampled_from([*_NAMES, "close", "keep-alive", "X-CUSTOM", " x-custom ", "a b", ""]),
    max_size=3,
).map(lambda tokens: ",".join(tokens).encode())
_FIELD = st.one_of(
    st.tuples(_NAME, st.sampled_from([b"1", b"v"])),
    st.tuples(st.sampled_from([b"Connection", b"connection"]), _LISTED),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_FIELD, max_size=10), st.booleans(), st.booleans())
def test_stripping_in_place_keeps_what_end_to_end_keeps(
    fields: list[tuple[bytes, bytes]], request: bool, lean: bool
) -> None:
    headers = LeanHeaders() if lean else Headers()
    for name, value in fields:
        headers.addRawHeader(name, value)
    expected = end_to_end(list(headers.getAllRawHeaders()), request=request)
    assert strip_hop_by_hop(headers, request=request) is headers
    assert [(name, list(values)) for name, values in headers.getAllRawHeaders()] == expected
