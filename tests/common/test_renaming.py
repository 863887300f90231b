"""A body's model renamed and every other byte as sent (nvpair/common/renaming.py;
docs/model-names.md#the-node-gets-its-own-name)."""

from __future__ import annotations

import json
import tracemalloc

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


# -- the bytes where they are (docs/robustness.md#what-a-request-body-costs) ---------------------


def _by_text(body: bytes, name: str, member: str = "model") -> bytes | None:
    """The scan it replaced, over the decoded text with every value built: the oracle."""
    decoder = json.JSONDecoder()

    def skip(text: str, at: int) -> int:
        while at < len(text) and text[at] in " \t\n\r":
            at += 1
        return at

    try:
        text = body.decode("utf-8")
        at = skip(text, 1 if text.startswith("\ufeff") else 0)
        if text[at] != "{":
            return None
        spans: dict[str, tuple[int, int, object]] = {}
        at = skip(text, at + 1)
        if text[at] != "}":
            while True:
                if text[at] != '"':
                    return None
                key, at = json.decoder.scanstring(text, at + 1)  # type: ignore[attr-defined]
                at = skip(text, at)
                if text[at] != ":":
                    return None
                start = skip(text, at + 1)
                value, at = decoder.raw_decode(text, start)
                if key == member:
                    spans[key] = (start, at, value)
                at = skip(text, at)
                if text[at] == "}":
                    break
                if text[at] != ",":
                    return None
                at = skip(text, at + 1)
    except (UnicodeDecodeError, ValueError, IndexError, RecursionError):
        return None
    span = spans.get(member)
    if span is None or not isinstance(span[2], str) or not span[2]:
        return None
    first = len(text[: span[0]].encode())
    last = first + len(text[span[0] : span[1]].encode())
    return body[:first] + json.dumps(name).encode() + body[last:]


_ANY = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=30,
)


@st.composite
def _objects(draw: st.DrawFn) -> bytes:
    """A JSON object as any client may spell it: members in any order and number, nested at
    any depth, escapes or raw UTF-8, ``NaN`` and ``Infinity``, spaces anywhere between tokens."""
    members = draw(
        st.lists(
            st.tuples(st.sampled_from(["model", "Model", "name", "\u00e9", "messages"]), _ANY),
            max_size=5,
        )
    )
    ascii_only = draw(st.booleans())
    space = draw(st.sampled_from(["", " ", "\n\t ", "\r\n"]))
    parts = [
        json.dumps(key, ensure_ascii=ascii_only)
        + space
        + ":"
        + space
        + json.dumps(value, ensure_ascii=ascii_only, separators=(space + ",", ":" + space))
        for key, value in members
    ]
    return (space + "{" + space + ("," + space).join(parts) + space + "}" + space).encode()


@given(_objects(), st.sampled_from(["model", "Model", "name", "\u00e9"]))
def test_the_scan_of_the_bytes_renames_as_the_scan_of_the_text_did(
    body: bytes, member: str
) -> None:
    assert renamed(body, "/m/q.gguf", member) == _by_text(body, "/m/q.gguf", member)


@given(_objects(), st.integers(0, 1 << 16), st.binary(min_size=1, max_size=3))
def test_a_mangled_body_is_renamed_only_if_it_is_still_json(
    body: bytes, at: int, junk: bytes
) -> None:
    """Bytes anywhere: never an exception, and a body still renamed is still JSON read the same
    way (admission parses every body it renames first)."""
    at %= len(body) + 1
    mangled = body[:at] + junk + body[at:]
    result = renamed(mangled, "n")
    try:
        json.loads(mangled)
    except (ValueError, RecursionError):
        assert result is None or _by_text(mangled, "n") == result
        return
    assert result == _by_text(mangled, "n")


@pytest.mark.parametrize("depth", [1, 5, 6, 7, 40, 400])
def test_values_nested_past_one_expressions_reach_are_read_level_by_level(depth: int) -> None:
    nested = "[" * depth + '{"model":"n"}' + "]" * depth
    keyed = nested.replace("[", '{"k":[').replace("]", "]}")
    body = b'{"a":%s,"model":"q","b":%s}' % (nested.encode(), keyed.encode())
    assert json.loads(body)["model"] == "q"
    assert renamed(body, "x") == body.replace(b'"model":"q"', b'"model":"x"')
    # The same with a fault at the bottom: no JSON, no renaming.
    broken = body.replace(b'{"model":"n"}', b'{"model":"n",}', 1)
    assert renamed(broken, "x") is None


def test_a_large_body_is_renamed_into_one_new_body_and_no_more() -> None:
    """Decoding the body, and building every value on the way, cost three bodies more."""
    prompt = "a\\n\u00e9" * (1 << 20)
    body = json.dumps({"model": "q", "prompt": prompt}, ensure_ascii=False).encode()
    tracemalloc.start()
    try:
        result = renamed(body, "/models/q.gguf")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result is not None and result.endswith(body[len(b'{"model": "q"') :])
    assert peak < 1.2 * len(body)
