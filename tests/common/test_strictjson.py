"""Strict JSON (:mod:`nvpair.common.strictjson`): JSON text reads as it does in :func:`json.loads`,
and Python's extensions to JSON are refused, each as a ValueError."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvpair.common.strictjson import NestedTooDeeply, loads

#: Any JSON value whose text :func:`json.dumps` writes as JSON (finite floats only).
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(VALUES, st.booleans())
def test_json_text_reads_as_json_loads_reads_it(value: object, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert loads(text) == json.loads(text)
    assert loads(text.encode()) == json.loads(text)


@pytest.mark.parametrize(
    "text", ["NaN", "Infinity", "-Infinity", "[NaN]", '{"a":Infinity}', '{"a":[1,-Infinity]}']
)
@pytest.mark.parametrize("finite", [True, False])
def test_nan_and_infinity_literals_are_refused(text: str, finite: bool) -> None:
    """Python reads them; JSON has no such literals, and re-serialized they break clients."""
    assert json.loads(text) is not None
    with pytest.raises(ValueError, match="is not a JSON value"):
        loads(text, finite=finite)


@pytest.mark.parametrize("text", ["1e400", "-1e400", '{"a":[1E999]}'])
def test_a_number_that_overflows_a_double_is_refused_unless_the_caller_judges_it(
    text: str,
) -> None:
    with pytest.raises(ValueError, match="overflows a double"):
        loads(text)
    assert json.dumps(loads(text, finite=False), allow_nan=True).count("Infinity") == 1


@pytest.mark.parametrize("text", ["1E+308", "5e-324", "-0.0", "1" + "0" * 400])
def test_large_but_representable_numbers_are_kept(text: str) -> None:
    """An integer beyond any float is still an exact int; only a float can overflow."""
    value = loads(text)
    assert value == json.loads(text)
    assert not isinstance(value, float) or math.isfinite(value)


def test_an_integer_past_pythons_digit_limit_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        loads("1" * 5000)


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1"])
def test_nesting_past_the_recursion_limit_is_a_value_error_not_a_recursion_error(
    text: str,
) -> None:
    with pytest.raises(NestedTooDeeply, match="nested too deeply") as caught:
        loads(text)
    assert isinstance(caught.value, ValueError)
    with pytest.raises(NestedTooDeeply):
        loads(text.encode())


def test_nesting_within_the_limit_reads() -> None:
    assert loads("[" * 200 + "]" * 200) == json.loads("[" * 200 + "]" * 200)


@pytest.mark.parametrize(
    "text",
    [
        '"\\ud800"',
        '"x\\udfff"',
        '{"\\udbff":1}',
        '{"a":["x\\ud83d"]}',
        '[1,{"b":"\\uDC00"}]',
    ],
)
def test_lone_surrogate_escapes_are_refused_only_when_asked(text: str) -> None:
    """They have no UTF-8 form; an inventory escapes them again on the way out, the broker
    link could not echo them."""
    assert loads(text) == json.loads(text)
    with pytest.raises(ValueError, match="lone surrogate"):
        loads(text, lone_surrogates=False)
    # Bytes in another encoding do not hide the escape from the check.
    with pytest.raises(ValueError, match="lone surrogate"):
        loads(text.encode("utf-16"), lone_surrogates=False)


@pytest.mark.parametrize("text", ['"\\ud83d\\ude00"', '"\\u0000"', '"\\ue000"', '"\\u00e9"'])
def test_a_surrogate_pair_and_other_escapes_are_not_lone(text: str) -> None:
    assert loads(text, lone_surrogates=False) == json.loads(text)


def test_bytes_are_decoded_as_json_loads_decodes_them() -> None:
    """UTF-8 with or without a BOM, UTF-16 and UTF-32 (an engine's list has been served
    with a BOM); a caller that insists on UTF-8 decodes first."""
    document = {"models": [{"name": "é"}]}
    text = json.dumps(document, ensure_ascii=False)
    for data in (
        text.encode(),
        b"\xef\xbb\xbf" + text.encode(),
        text.encode("utf-16"),
        text.encode("utf-32"),
    ):
        assert loads(data) == document


@pytest.mark.parametrize("data", [b"", b"{x", b"\xff\xfe\xfa", b"[1,]", b"{} {}", "\ufeff{}"])
def test_what_json_loads_refuses_stays_refused_as_a_value_error(data: str | bytes) -> None:
    with pytest.raises(ValueError):
        loads(data)
