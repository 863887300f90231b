# -*- test-case-name: tests.wire.test_headers -*-
"""Hop-by-hop removal in place (:func:`nvpair.wire.headers.strip_hop_by_hop`) keeps exactly what
:func:`~nvpair.wire.headers.end_to_end` keeps, in the same order, from a head's ``Fields``, whatever
case the names come in and whatever ``Connection`` lists."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nvpair.wire.headers import end_to_end, strip_hop_by_hop
from nvpair.wire.message import Fields

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
@given(st.lists(_FIELD, max_size=10), st.booleans())
def test_stripping_in_place_keeps_what_end_to_end_keeps(
    pairs: list[tuple[bytes, bytes]], request: bool
) -> None:
    fields = Fields.of(pairs)
    expected = end_to_end(list(fields.items()), request=request)
    assert strip_hop_by_hop(fields, request=request) is fields
    assert [(name, list(values)) for name, values in fields.items()] == expected
