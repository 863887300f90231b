"""Admission: body rules, model extraction, the loopback gate (docs/request-path.md#admission)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress

from nvpair.engines.admission import BadBody, _document, is_loopback, model_from_body
from nvpair.engines.table import LLAMACPP, LMSTUDIO, OLLAMA, RouteClass

INF, OTHER = RouteClass.INFERENCE, RouteClass.OTHER


@pytest.mark.parametrize("engine", [OLLAMA, LMSTUDIO, LLAMACPP])
@pytest.mark.parametrize("body", [b"", b"[]", b'"s"', b"{x", b"\xff\xfe", b"null"])
def test_inference_body_must_be_a_json_object(engine: object, body: bytes) -> None:
    with pytest.raises(BadBody) as refused:
        model_from_body(engine, INF, "/v1/chat/completions", body)  # type: ignore[arg-type]
    assert refused.value.reason == "bad-json"


@pytest.mark.parametrize("body", [b"{}", b'{"model":""}', b'{"model":5}', b'{"model":null}'])
def test_ollama_requires_a_model(body: bytes) -> None:
    with pytest.raises(BadBody) as refused:
        model_from_body(OLLAMA, INF, "/api/chat", body)
    assert refused.value.reason == "model-missing"


@pytest.mark.parametrize("engine", [LMSTUDIO, LLAMACPP])
def test_other_engines_allow_modelless_inference(engine: object) -> None:
    assert model_from_body(engine, INF, "/v1/completions", b"{}") is None  # type: ignore[arg-type]


def test_model_is_read_from_the_body() -> None:
    assert model_from_body(OLLAMA, INF, "/api/chat", b'{"model":"llama3"}') == "llama3"


def test_other_routes_are_never_refused_and_may_name_a_model() -> None:
    assert model_from_body(OLLAMA, OTHER, "/api/pull", b"{broken") is None
    assert model_from_body(OLLAMA, OTHER, "/api/pull", b'{"name":"phi3"}') == "phi3"
    assert model_from_body(OLLAMA, OTHER, "/api/pull", b'{"model":"a","name":"b"}') == "a"
    # "name" is only the deprecated spelling on the routes that had it.
    assert model_from_body(OLLAMA, OTHER, "/api/copy", b'{"name":"phi3"}') is None


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        (IPv4Address("TCP", "127.0.0.1", 5), True),
        (IPv4Address("TCP", "127.8.9.10", 5), True),
        (IPv6Address("TCP", "::1", 5), True),
        (IPv6Address("TCP", "::ffff:127.0.0.1", 5), True),
        (IPv6Address("TCP", "::ffff:192.168.1.7", 5), False),
        (IPv4Address("TCP", "192.168.1.7", 5), False),
        (IPv6Address("TCP", "fe80::1%eth0", 5), False),
        (UNIXAddress(b"/run/x.sock"), True),
    ],
)
def test_loopback_gate_unwraps_v4_mapped(address: object, loopback: bool) -> None:
    """On 3.11 ::ffff:127.0.0.1 is not is_loopback by itself: it is unwrapped first."""
    assert is_loopback(address) is loopback


def _reference_document(body: bytes) -> object:
    try:
        return json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


_JSON_TEXT = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
).map(json.dumps)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=12).map(lambda tail: b"{" + tail),
        st.binary(max_size=12),
        st.tuples(_JSON_TEXT, st.sampled_from(["utf-8", "utf-16", "utf-16-le", "utf-32"])).map(
            lambda text: text[0].encode(text[1])
        ),
        st.sampled_from([b'{"model": "\\ud800"}', b'{"model": "\xed\xa0\x80"}', b"{\x00}"]),
    )
)
def test_a_body_reads_as_json_loads_reads_it(body: bytes) -> None:
    """The UTF-8 shortcut for a body opening with ``{`` reads what ``json.loads`` reads, and
    refuses what it refuses, in any encoding it detects."""
    assert repr(_document(body)) == repr(_reference_document(body))
