"""The top level of a JSON object read where it lies (nvpair/common/jsonscan.py;
docs/robustness.md#what-a-request-body-costs): the same members, in the same order, as Python's
``json`` reads, from the bytes or from the text, with nothing built."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvpair.common.jsonscan import Body, is_key, members
from tests.common.test_renaming import _objects


def decoded(key: Body) -> str:
    spelled = b'"%s"' % key if isinstance(key, bytes) else f'"{key}"'
    value: str = json.loads(spelled)
    return value


def read_by_json(body: Body) -> list[tuple[str, object]]:
    pairs: list[tuple[str, object]] = []

    def top(found: list[tuple[str, object]]) -> object:
        pairs[:] = found
        return dict(found)

    json.loads(body, object_pairs_hook=top)
    return pairs


@settings(deadline=None)
@given(_objects(), st.booleans())
def test_every_member_in_order_with_its_value_where_it_lies(body: bytes, text: bool) -> None:
    scanned: Body = body.decode() if text else body
    found = [(decoded(key), json.loads(scanned[start:end])) for key, start, end in members(scanned)]
    expected = read_by_json(scanned)
    # NaN is no value equal to itself: compare spellings.
    assert json.dumps(found) == json.dumps(expected)


@pytest.mark.parametrize(
    "body",
    [
        "",
        "[]",
        '"x"',
        "{",
        '{"a"}',
        '{"a":1,}',
        '{"a":1 "b":2}',
        '{"a":[1,}]}',
        '{"a":1} x',
        '{"a":tru}',
    ],
)
def test_no_object_is_a_value_error(body: str) -> None:
    for scanned in (body, body.encode()):
        with pytest.raises(ValueError):
            list(members(scanned))


def test_a_key_is_compared_as_it_decodes_and_only_then() -> None:
    assert is_key(b"model", "model") and is_key("model", "model")
    assert is_key(b"\\u006dodel", "model") and is_key("\\u006dodel", "model")
    assert not is_key(b"Model", "model") and not is_key(b"\\u006dodel2", "model")
    assert is_key("\u00e9".encode(), "\u00e9") and is_key("\\u00e9", "\u00e9")


def test_a_large_body_is_scanned_with_nothing_built() -> None:
    body = b'{"model":"q","messages":[{"role":"user","content":"%s"}]}' % (b"a\\n" * (4 << 20))
    tracemalloc.start()
    try:
        keys = [key for key, _, _ in members(body)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert keys == [b"model", b"messages"] and peak < 1 << 20
