"""Stats from a streamed body's tail (docs/request-path.md#stats-from-the-streams-tail): each
engine's report, the fallback, bounds."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvpair.engines.inferstats import (
    _CONTENT_PIECES,
    _LINE_CARRY,
    _TAIL_PIECES,
    TAIL_BYTES,
    Stats,
    StatsReader,
)


def read(body: bytes, *, first: float = 1.25, end: float = 2.25, admitted: float = 1.0) -> Stats:
    reader = StatsReader(admitted)
    reader.feed(body, first)
    stats = reader.finish(end)
    assert stats is not None
    return stats


def sse(*events: object) -> bytes:
    return b"".join(
        b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n"
        for e in events
    )


def chunk(content: str) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}


def test_openai_usage_chunk() -> None:
    body = sse(
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
        chunk("Hi"),
        chunk(" there"),
        {"choices": [{"delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}},
        b"[DONE]",
    )
    stats = read(body)
    assert (stats.prompt_tokens, stats.completion_tokens, stats.estimated) == (9, 2, False)
    assert stats.ttft_ms == 250
    assert stats.tokens_per_second == 2.0  # 2 tokens over 1 s of streaming


def test_openai_whole_body_usage() -> None:
    body = json.dumps(
        {
            "choices": [{"message": {"content": "Hi"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 7},
        }
    ).encode()
    stats = read(body, first=1.5, end=1.5)
    assert (stats.prompt_tokens, stats.completion_tokens) == (3, 7)
    assert stats.tokens_per_second is None  # no streaming time, no engine figure


def test_ollama_final_counts_in_nanoseconds() -> None:
    lines = [{"message": {"content": "a"}, "done": False}] * 3 + [
        {
            "message": {"content": ""},
            "done": True,
            "prompt_eval_count": 12,
            "eval_count": 340,
            "eval_duration": 8_000_000_000,
        }
    ]
    stats = read(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    assert (stats.prompt_tokens, stats.completion_tokens) == (12, 340)
    assert stats.tokens_per_second == 42.5 and not stats.estimated


def test_ollama_v1_completions_zero_usage_quirk_takes_the_last() -> None:
    zero = {"prompt_tokens": 0, "completion_tokens": 0}
    body = sse(
        {"choices": [{"text": "a"}], "usage": zero},
        {"choices": [{"text": "b"}], "usage": zero},
        {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}},
        b"[DONE]",
    )
    stats = read(body)
    assert (stats.prompt_tokens, stats.completion_tokens) == (4, 2)


def test_llamacpp_timings() -> None:
    final = {
        "content": "",
        "stop": True,
        "timings": {"prompt_n": 5, "predicted_n": 4, "predicted_per_second": 50.0},
    }
    stats = read(sse({"content": "a"}, {"content": "b"}, final))
    assert (stats.prompt_tokens, stats.completion_tokens, stats.tokens_per_second) == (5, 4, 50.0)


def test_lmstudio_stats_give_the_rate() -> None:
    body = json.dumps(
        {
            "usage": {"prompt_tokens": 2, "completion_tokens": 4},
            "stats": {"tokens_per_second": 37.5, "time_to_first_token": 0.1},
        }
    ).encode()
    stats = read(body)
    assert (stats.completion_tokens, stats.tokens_per_second) == (4, 37.5)


def test_fallback_counts_content_events_and_is_estimated() -> None:
    body = sse(
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
        chunk("a"),
        chunk("b"),
        chunk("c"),
        {"choices": [{"delta": {}, "finish_reason": "stop"}]},
        b"[DONE]",
    )
    stats = read(body)
    assert (stats.completion_tokens, stats.estimated, stats.prompt_tokens) == (3, True, None)
    assert stats.tokens_per_second == 3.0


def test_fallback_counts_ndjson_lines_with_content() -> None:
    body = b"".join(json.dumps({"response": t, "done": False}).encode() + b"\n" for t in "xyz")
    stats = read(body)
    assert (stats.completion_tokens, stats.estimated) == (3, True)


def test_nothing_measured_without_a_body() -> None:
    assert StatsReader(0.0).finish(1.0) is None


def test_to_json_has_only_measured_fields() -> None:
    assert Stats(None, 3, None, 10, True).to_json() == {
        "completionTokens": 3,
        "ttftMs": 10,
        "estimated": True,
    }


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=40_000), cuts=st.lists(st.integers(min_value=0), max_size=40))
def test_never_raises_stays_bounded_and_ignores_split_points(body: bytes, cuts: list[int]) -> None:
    points = sorted({c % (len(body) + 1) for c in cuts})
    pieces = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    reader = StatsReader(0.0)
    for piece in pieces:
        reader.feed(piece, 1.0)
        assert sum(map(len, reader._tail)) == reader._tail_size < 2 * TAIL_BYTES
        assert len(reader._carry) <= _LINE_CARRY
    whole = StatsReader(0.0)
    whole.feed(body, 1.0)
    assert reader.finish(2.0) == whole.finish(2.0)


@settings(max_examples=200, deadline=None)
@given(
    events=st.lists(st.sampled_from([chunk("tok"), chunk(""), {"done": True}]), max_size=30),
    cuts=st.lists(st.integers(min_value=0), max_size=20),
)
def test_event_counts_survive_any_split(events: list[dict[str, object]], cuts: list[int]) -> None:
    body = sse(*events)
    points = sorted({c % (len(body) + 1) for c in cuts})
    reader = StatsReader(0.0)
    for a, b in zip([0, *points], [*points, len(body)], strict=True):
        reader.feed(body[a:b], 1.0)
    stats = reader.finish(2.0)
    expected = sum(1 for e in events if e == chunk("tok"))
    if expected:
        assert stats is not None and stats.completion_tokens == expected and stats.estimated


#: Content pieces as each dialect streams them, with the spacing and escapes JSON allows; each
#: counts as one, except the empty ones.
PIECES = [
    (b'data: {"choices":[{"delta":{"content":"tok"}}]}', 1),
    (b'data: {"choices": [{"delta": {"content" : "\\"quoted\\""}}]}', 1),
    (b'data: {"choices":[{"delta":{"content":""}}]}', 0),
    (b'data: {"choices":[{"text":"\\n"}]}', 1),
    (b'{"model":"llama3","response":"x","done":false}', 1),
    (b'{"message":{"role":"assistant","content":"","thinking":"hm"}}', 0),
    (b'data: {"reasoning_content":"r","x_content":"y"}', 0),
    (b"data: [DONE]", 0),
    (b": keep-alive", 0),
    (b"", 0),
]


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(st.sampled_from(PIECES), max_size=12),
    separator=st.sampled_from([b"\n", b"\n\n", b"\r\n"]),
    cuts=st.lists(st.integers(min_value=0), max_size=12),
)
def test_content_pieces_count_the_same_whole_or_split(
    lines: list[tuple[bytes, int]], separator: bytes, cuts: list[int]
) -> None:
    """The whole-line fast path and the line-by-line path count the same pieces: a stream's
    estimate does not depend on how the engine's writes were split into reads."""
    body = b"".join(line + separator for line, _ in lines)
    expected = sum(count for _, count in lines)
    whole = StatsReader(0.0)
    whole.feed(body, 1.0)
    points = sorted({c % (len(body) + 1) for c in cuts})
    split = StatsReader(0.0)
    for a, b in zip([0, *points], [*points, len(body)], strict=True):
        split.feed(body[a:b], 1.0)
    bytewise = StatsReader(0.0)
    for index in range(len(body)):
        bytewise.feed(body[index : index + 1], 1.0)
    counts = {reader.finish(2.0) for reader in (whole, split, bytewise)}
    assert len(counts) == 1
    (stats,) = counts
    if expected:
        assert stats is not None and stats.completion_tokens == expected and stats.estimated
    else:
        assert stats is None or stats.completion_tokens is None


def test_a_body_dripped_byte_by_byte_keeps_a_small_tail_and_reads_the_same() -> None:
    """A slow or hostile engine sending one byte per read must not make each stream hold
    thousands of one-byte objects."""
    usage = {"prompt_tokens": 9, "completion_tokens": 40, "total_tokens": 49}
    body = sse(*[chunk("tok")] * 40, {"choices": [], "usage": usage}, b"[DONE]")
    reader = StatsReader(0.0)
    for i in range(len(body)):
        reader.feed(body[i : i + 1], 1.0)
        assert len(reader._tail) <= _TAIL_PIECES
    whole = StatsReader(0.0)
    whole.feed(body, 1.0)
    dripped = reader.finish(2.0)
    assert dripped == whole.finish(2.0)
    assert dripped is not None and (dripped.prompt_tokens, dripped.completion_tokens) == (9, 40)


@pytest.mark.parametrize(
    "count", [b"1" + b"0" * 400, b"1e999", b"-1e999", b"NaN", b"Infinity", b"10000000000000000"]
)
def test_an_absurd_count_is_not_believed_and_never_raises(count: bytes) -> None:
    """JSON allows integers of any length, and Python's parser reads ``1e999`` as infinity and
    ``NaN`` as NaN: none becomes a token count (nor a /metrics counter that breaks every scrape
    after it)."""
    body = b'{"choices":[],"usage":{"prompt_tokens":%b,"completion_tokens":%b}}' % (count, count)
    ollama = b'{"done":true,"prompt_eval_count":%b,"eval_count":%b,"eval_duration":5}\n' % (
        count,
        count,
    )
    for raw in (body, ollama):
        reader = StatsReader(0.0)
        reader.feed(raw, 1.0)
        stats = reader.finish(2.0)
        assert stats is not None and stats.prompt_tokens is None
        # At most the reader's own estimate, never the report's figure.
        assert stats.completion_tokens is None or stats.estimated


#: The longest reports engines send, each after a long answer: LM Studio's pretty-printed REST
#: v0 answer (``usage``, then ``stats``, ``model_info`` and ``runtime``), and llama.cpp's final
#: OpenAI chunk (``usage`` and its full ``timings``) followed by ``[DONE]``.
_LONG_CONTENT = "word " * 2000
_LMSTUDIO_V0 = json.dumps(
    {
        "id": "chatcmpl-6vx1c0pu4ghv5ykcq0n5ne",
        "object": "chat.completion",
        "created": 1764637200,
        "model": "qwen2.5-7b-instruct-1m",
        "choices": [
            {
                "index": 0,
                "logprobs": None,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": _LONG_CONTENT},
            }
        ],
        "usage": {"prompt_tokens": 1204, "completion_tokens": 2000, "total_tokens": 3204},
        "stats": {
            "tokens_per_second": 37.59399891246521,
            "time_to_first_token": 0.411,
            "generation_time": 53.201,
            "stop_reason": "eosFound",
        },
        "model_info": {
            "arch": "qwen2",
            "quant": "Q4_K_M",
            "format": "gguf",
            "context_length": 1010000,
        },
        "runtime": {
            "name": "llama.cpp-linux-x86_64-nvidia-cuda12-avx2",
            "version": "1.59.0",
            "supported_formats": ["gguf"],
        },
    },
    indent=2,
).encode()
_LLAMACPP_FINAL = sse(
    *[chunk("word ") for _ in range(200)],
    {
        "choices": [{"finish_reason": "stop", "index": 0, "delta": {}}],
        "created": 1764637200,
        "id": "chatcmpl-Xw6lYw1lCk3hQ9M5oJcGzJ2fN8wXbQpE",
        "model": "Qwen2.5-7B-Instruct-Q4_K_M.gguf",
        "system_fingerprint": "b7213-5b6c7a8d9",
        "object": "chat.completion.chunk",
        "usage": {"completion_tokens": 2000, "prompt_tokens": 1204, "total_tokens": 3204},
        "timings": {
            "cache_n": 1187,
            "prompt_n": 1204,
            "prompt_ms": 412.345,
            "prompt_per_token_ms": 0.34248,
            "prompt_per_second": 2919.87654321,
            "predicted_n": 2000,
            "predicted_ms": 53201.123,
            "predicted_per_token_ms": 26.6005615,
            "predicted_per_second": 37.59399891246521,
            "draft_n": 0,
            "draft_n_accepted": 0,
        },
    },
    b"[DONE]",
)


@pytest.mark.parametrize("body", [_LMSTUDIO_V0, _LLAMACPP_FINAL], ids=["lmstudio-v0", "llamacpp"])
def test_the_longest_reports_fit_the_tail(body: bytes) -> None:
    """docs/performance.md#held-streams: the tail is short, but every engine's report (the
    longest of them here) still begins within it."""
    reader = StatsReader(1.0)
    for start in range(0, len(body), 100):
        reader.feed(body[start : start + 100], 1.25)
    stats = reader.finish(2.25)
    assert stats is not None and not stats.estimated
    assert (stats.prompt_tokens, stats.completion_tokens) == (1204, 2000)
    assert stats.tokens_per_second == 37.59


def test_a_stream_holds_under_two_kib_of_its_tail() -> None:
    """docs/performance.md#held-streams: the tail is what every held stream costs."""
    reader = StatsReader(0.0)
    for _ in range(100):
        reader.feed(sse(chunk("a token or two ")), 1.0)
        assert reader._tail_size < 2048


#: Lines as a stream's reads bring them: short events, and lines past the kept prefix (a long
#: piece of content, or many pieces on one line), which count as one piece each.
_LINES = st.one_of(
    st.sampled_from([line for line, _ in PIECES]),
    st.integers(min_value=_LINE_CARRY - 40, max_value=_LINE_CARRY + 40).map(
        lambda size: (b'data: {"content":"' + b"x" * size + b'"}')[:size]
    ),
    st.integers(min_value=1, max_value=40).map(lambda n: b'{"response":"a"} ' * n),
)


def _reference_count(body: bytes) -> int:
    """The estimate's definition, line by line: a line past the kept prefix is one piece, any
    other counts the pieces in it (the last line too, unterminated)."""
    patterns = [pattern for _, pattern in _CONTENT_PIECES]
    return sum(
        1 if len(line) > _LINE_CARRY else sum(len(p.findall(line)) for p in patterns)
        for line in body.split(b"\n")
    )


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(_LINES, max_size=12),
    cuts=st.lists(st.integers(min_value=0), max_size=12),
)
def test_reads_of_many_lines_count_as_their_lines_one_by_one(
    lines: list[bytes], cuts: list[int]
) -> None:
    """A read holding many lines is counted in one pass; the count is the definition's, line by
    line, whatever the lines' lengths and wherever the reads were split."""
    body = b"\n".join(lines)
    points = sorted({c % (len(body) + 1) for c in cuts})
    reader = StatsReader(0.0)
    for a, b in zip([0, *points], [*points, len(body)], strict=True):
        reader.feed(body[a:b], 1.0)
    stats = reader.finish(2.0)
    expected = _reference_count(body)
    if expected:
        assert stats is not None and stats.completion_tokens == expected and stats.estimated
    else:
        assert stats is None or stats.completion_tokens is None


# -- what the engine found in its cache (docs/fleet-scheduling.md#the-correction) --------------


def test_llamacpp_timings_say_how_much_of_the_prompt_came_from_cache() -> None:
    final = {
        "content": "",
        "stop": True,
        "timings": {"cache_n": 112, "prompt_n": 67, "predicted_n": 4},
    }
    stats = read(sse({"content": "a"}, final))
    # prompt_n is what was evaluated: the prompt is that and what came from cache.
    assert (stats.prompt_tokens, stats.cached_tokens) == (179, 112)


def test_openai_usage_details_say_it_and_take_precedence() -> None:
    body = json.dumps(
        {
            "choices": [{"message": {"content": "hi"}}],
            "usage": {
                "prompt_tokens": 179,
                "completion_tokens": 4,
                "prompt_tokens_details": {"cached_tokens": 112},
            },
            "timings": {"cache_n": 100, "prompt_n": 79, "predicted_n": 4},
        }
    ).encode()
    stats = read(body)
    assert (stats.prompt_tokens, stats.cached_tokens) == (179, 112)
    assert read(_LLAMACPP_FINAL).cached_tokens == 1187


@pytest.mark.parametrize(
    "details",
    [{}, {"cached_tokens": -1}, {"cached_tokens": True}, {"cached_tokens": "5"}, None, 7],
)
def test_a_cache_report_that_is_no_count_is_no_report(details: object) -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 1, "prompt_tokens_details": details}
    assert read(json.dumps({"usage": usage}).encode()).cached_tokens is None


def test_more_cached_than_read_or_no_prompt_count_is_not_believed() -> None:
    usage = {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 11}}
    assert read(json.dumps({"usage": usage}).encode()).cached_tokens is None
    timings = {"cache_n": 5}
    stats = read(json.dumps({"content": "x", "timings": timings}).encode())
    assert stats.prompt_tokens is None and stats.cached_tokens is None
    nothing = read(json.dumps({"usage": {"completion_tokens": 3}}).encode())
    assert nothing.cached_tokens is None
