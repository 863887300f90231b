"""The simulated node's pacing of non-streamed Ollama answers."""

from __future__ import annotations

import json

import pytest

from bench.simnode import generation_seconds


def body(**fields: object) -> bytes:
    return json.dumps({"model": "m:1b", "prompt": "hi", **fields}).encode()


def test_a_non_streamed_answer_takes_as_long_as_its_tokens_would_stream() -> None:
    options = {"num_predict": 50}
    paced = generation_seconds(
        b"POST", b"/api/generate", body(stream=False, options=options), 200, 0.02
    )
    assert paced == pytest.approx(1.0)
    chat = generation_seconds(b"POST", b"/api/chat", body(stream=False), 200, 0.02)
    assert chat == pytest.approx(4.0)  # no limit: every token the engine has


@pytest.mark.parametrize(
    ("method", "path", "data"),
    [
        (b"POST", b"/api/generate", body()),  # Ollama streams unless told not to
        (b"POST", b"/api/generate", body(stream=True)),
        (b"GET", b"/api/ps", b""),
        (b"POST", b"/v1/chat/completions", body(stream=False)),
        (b"POST", b"/api/generate", b"not json"),
        (b"POST", b"/api/generate", b"[]"),
    ],
)
def test_anything_else_is_not_paced(method: bytes, path: bytes, data: bytes) -> None:
    assert generation_seconds(method, path, data, 200, 0.02) == 0.0


def test_a_limit_over_the_engine_tokens_or_invalid_changes_nothing() -> None:
    for limit in (500, -1, True, "7"):
        data = body(stream=False, options={"num_predict": limit})
        assert generation_seconds(b"POST", b"/api/generate", data, 10, 0.1) == pytest.approx(1.0)
