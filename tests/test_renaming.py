"""A body's model renamed and every other byte as sent (nvpair/common/renaming.py;
docs/model-names.md#the-node-gets-its-own-name)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvpair.common.renaming import renamed


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"model":"q","stream":true}', b'{"model":"/m/q.gguf","stream":true}'),
        # Odd whitespace everywhere, kept.
        (
            b' \r\n{ \t"messages" :[ {"role":"user"} ] ,\n  "model"\t:\r\n "q"  \n}\n ',
            b' \r\n{ \t"messages" :[ {"role":"user"} ] ,\n  "model"\t:\r\n "/m/q.gguf"  \n}\n ',
        ),
        # Escapes elsewhere are untouched; the value's own spelling does not matter.
        (
            b'{"prompt":"caf\\u00e9 \\/ \\"x\\"","model":"\\u0071"}',
            b'{"prompt":"caf\\u00e9 \\/ \\"x\\"","model":"/m/q.gguf"}',
        ),
        # A key spelled with escapes is that key, to the proxy and to every engine.
        (b'{"\\u006dodel":"q"}', b'{"\\u006dodel":"/m/q.gguf"}'),
        # Duplicate keys: the last one is the one read, and the only one replaced.
        (
            b'{"model":"first","n":1.50e+1,"model":"q"}',
            b'{"model":"first","n":1.50e+1,"model":"/m/q.gguf"}',
        ),
        # A model nested deeper is content, not the request's model.
        (
            b'{"tools":[{"model":"q"}],"model":"q","x":{"model":"q"}}',
            b'{"tools":[{"model":"q"}],"model":"/m/q.gguf","x":{"model":"q"}}',
        ),
        # Non-ASCII text around the value: byte offsets, not character offsets.
        (
            '{"prompt":"日本語 é","model":"q","tail":"ü"}'.encode(),
            '{"prompt":"日本語 é","model":"/m/q.gguf","tail":"ü"}'.encode(),
        ),
        # A UTF-8 byte order mark, which admission accepts, stays.
        (b'\xef\xbb\xbf{"model":"q"}', b'\xef\xbb\xbf{"model":"/m/q.gguf"}'),
    ],
)
def test_only_the_models_value_changes_byte_for_byte(body: bytes, expected: bytes) -> None:
    assert renamed(body, "/m/q.gguf") == expected


def test_the_new_name_is_a_json_string_in_ascii() -> None:
    assert (
        renamed(b'{"model":"q"}', 'C:\\m\\"é".gguf') == b'{"model":"C:\\\\m\\\\\\"\\u00e9\\".gguf"}'
    )
    assert renamed(b'{"model":"q"}', "\ud800") == b'{"model":"\\ud800"}'


def test_name_is_the_fallback_when_model_names_none() -> None:
    """Ollama's /api/show and friends read ``name`` when ``model`` is empty."""
    assert renamed(b'{"model":"","name":"q"}', "n", "name") == b'{"model":"","name":"n"}'
    assert renamed(b'{"name":"q"}', "n", "name") == b'{"name":"n"}'
    assert renamed(b'{"model":"m","name":"q"}', "n", "model") == b'{"model":"n","name":"q"}'
    assert renamed(b'{"name":"q"}', "n") is None
    # An Ollama body's member as it spells it (its decoder folds case).
    assert renamed(b'{"Model":"q"}', "n", "Model") == b'{"Model":"n"}'


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b'"model"',
        b"{}",
        b'{"model":""}',
        b'{"model":5}',
        b'{"model":"q","model":null}',
        b'{"model":"q"',
        b'{"model" "q"}',
        b'{"model":"q" "x":1}',
        b'{model:"q"}',
        b'{"model":"q",}',
        b"\xff\xfe{\x00}\x00",
        '{"model":"q"}'.encode("utf-16"),
        b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b',"model":"q"}',
    ],
)
def test_a_body_naming_no_model_that_way_is_left_to_the_caller(body: bytes) -> None:
    """None, never an exception: the attempt then sends the body as it is."""
    assert renamed(body, "x") is None


# -- property: any spelling of any object --------------------------------------------------------

_SPACE = st.text(alphabet=" \t\r\n", max_size=3)
_KEYS = st.sampled_from(["model", "messages", "stream", "name", "prompt", "modelx", "Model"])
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def _spelled_key(draw: st.DrawFn, key: str) -> str:
    """``key`` as a JSON string, some characters as \\u escapes."""
    escaped = [f"\\u{ord(c):04x}" if draw(st.booleans()) else c for c in key]
    return '"' + "".join(escaped) + '"'


@st.composite
def _bodies(draw: st.DrawFn) -> tuple[list[tuple[str, str, str, object]], str, str]:
    """Members (spelled key, space before the value, spelled value, value), and the spaces."""
    members: list[tuple[str, str, str, object]] = []
    for _ in range(draw(st.integers(0, 6))):
        key = draw(_KEYS)
        value = draw(st.text(max_size=6) if key == "model" and draw(st.booleans()) else _VALUES)
        spelled = json.dumps(value, ensure_ascii=draw(st.booleans()))
        members.append((draw(_spelled_key(key)), draw(_SPACE), spelled, value))
    return members, draw(_SPACE), draw(_SPACE)


def _render(members: list[tuple[str, str, str, object]], outer: str, inner: str) -> bytes:
    text = "{" + inner
    text += ",".join(
        f"{inner}{key}{inner}:{space}{value}{inner}" for key, space, value, _ in members
    )
    return (outer + text + "}" + outer).encode()


@given(_bodies(), st.text(min_size=1, max_size=8))
def test_any_spelling_keeps_every_byte_but_the_last_models_value(
    body: tuple[list[tuple[str, str, str, object]], str, str], name: str
) -> None:
    members, outer, inner = body
    original = _render(members, outer, inner)
    models = [i for i, (key, _, _, _) in enumerate(members) if json.loads(key) == "model"]
    result = renamed(original, name)
    last = members[models[-1]] if models else None
    if last is None or not (isinstance(last[3], str) and last[3]):
        assert result is None
        return
    changed = list(members)
    key, space, _, _ = last
    changed[models[-1]] = (key, space, json.dumps(name), name)
    assert result == _render(changed, outer, inner)
    assert json.loads(result) == {**json.loads(original), "model": name}
