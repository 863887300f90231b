"""Token statistics from a response body as it streams, never buffering it
(docs/request-path.md#workload-lifecycle).

The reader sees every chunk once, keeps only the last few KiB (the tail, where every engine
puts its usage report: the OpenAI ``usage`` chunk or field, Ollama's final counts, llama.cpp's
``timings``, LM Studio's ``stats``) and counts stream events on the way, so that a stream
without a report still yields an estimate. It never parses content and never raises: any body
at all, split anywhere, produces stats or nothing.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple

#: How much of the body's end is kept for reading the engine's report. Every engine's report
#: (usage, timings, stats, Ollama's counts) begins within its last 700 bytes or so (LM Studio's
#: pretty-printed answer, its ``usage`` followed by ``stats``, ``model_info`` and ``runtime``, is
#: the longest; tests/engines/test_inferstats.py holds the longest ones); the tail is held by every
#: stream in flight, so it is what thousands of held streams cost
#: (docs/performance.md#held-streams).
TAIL_BYTES = 1024

#: Most chunks the tail holds as they came before joining them (see :meth:`StatsReader._keep`).
_TAIL_PIECES = 32

#: Longest partial line carried between chunks for event counting; longer lines are counted
#: without being kept (an event's content does not matter, only that it has some).
_LINE_CARRY = 512

#: A body that arrived faster than this was not streamed at a measurable rate (a whole answer
#: in a few reads): no throughput is derived from it.
MIN_SPAN = 0.05

_DECODER = json.JSONDecoder()
_NUMBER = rb"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
# Keys whose value is an object holding the report.
_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_TIMINGS = re.compile(rb'"timings"\s*:\s*\{')
_LMSTATS = re.compile(rb'"stats"\s*:\s*\{')
# Ollama reports at the top level of its final object.
_OLLAMA = {
    key: re.compile(rb'"' + key.encode() + rb'"\s*:\s*' + _NUMBER)
    for key in ("prompt_eval_count", "eval_count", "eval_duration")
}
# A piece of content in a stream: a generated piece of text, not empty, under the key every
# dialect uses for it (OpenAI chat and LM Studio "content", completions "text", Ollama
# "response", llama.cpp "content"). One pattern per key, each opening with its whole key: the
# regex engine then finds candidates with a fast literal scan instead of trying an alternation
# at every quote of the JSON. This runs on every chunk of every stream; counting pieces this way
# costs a fifth of judging each line with one line-anchored pattern (bench/README.md, the stats
# reader). None of them matches across a line break, so a chunk's count is its lines' sum. Each
# pattern is kept beside its key as a literal: a key absent from the data is found absent by
# ``bytes.find`` (a vectorized scan) at a fraction of what the regex engine's scan costs.
_CONTENT_PIECES = tuple(
    (b'"' + key + b'"', re.compile(b'"' + key + rb'"[ \t\r\f\v]*:[ \t\r\f\v]*"(?:[^"\\\n]|\\.)'))
    for key in (b"content", b"text", b"response")
)


def _content_pieces(data: bytes) -> int:
    """How many pieces of content ``data`` holds (see :data:`_CONTENT_PIECES`)."""
    count = 0
    for key, pattern in _CONTENT_PIECES:
        if data.find(key) >= 0:
            count += len(pattern.findall(data))
    return count


class Stats(NamedTuple):
    """What could be measured; fields that could not be are None. (A NamedTuple: one is made
    for every answer measured, immutable for a fraction of a frozen attrs class's cost;
    docs/performance.md#per-dispatch-overheads.)

    :ivar cached_tokens: of ``prompt_tokens``, how many the engine said it read from its
        cache (llama.cpp's ``timings.cache_n``, OpenAI's
        ``usage.prompt_tokens_details.cached_tokens``); None when it did not say
        (docs/fleet-scheduling.md#conversations-go-where-their-cache-is).
    """

    prompt_tokens: int | None
    completion_tokens: int | None
    tokens_per_second: float | None
    ttft_ms: int | None
    estimated: bool
    cached_tokens: int | None = None

    def to_json(self) -> dict[str, object]:
        """A workload event's ``stats`` object (docs/broker-protocol.md#workload-events): only the
        measured fields."""
        out: dict[str, object] = {}
        if self.prompt_tokens is not None:
            out["promptTokens"] = self.prompt_tokens
        if self.completion_tokens is not None:
            out["completionTokens"] = self.completion_tokens
        if self.tokens_per_second is not None:
            out["tokensPerSecond"] = self.tokens_per_second
        if self.ttft_ms is not None:
            out["ttftMs"] = self.ttft_ms
        out["estimated"] = self.estimated
        return out


def _last_object(tail: bytes, pattern: re.Pattern[bytes], key: bytes) -> dict[str, object] | None:
    """The last ``"key": {...}`` object in ``tail`` that parses whole.

    Found from the end by ``bytes.rfind`` (a vectorized scan) and confirmed where the key is,
    rather than by the regex engine scanning the whole tail for every match: ``pattern``
    matches only where its key begins, and no two of its matches overlap.
    """
    end = len(tail)
    while (at := tail.rfind(key, 0, end)) >= 0:
        # The next candidate may overlap this one by its last byte at most (a key is quoted).
        end = at + len(key) - 1
        match = pattern.match(tail, at)
        if match is None:
            continue
        try:
            value, _ = _DECODER.raw_decode(tail[match.end() - 1 :].decode("utf-8", "replace"))
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _last_number(tail: bytes, pattern: re.Pattern[bytes]) -> float | None:
    matches = pattern.findall(tail)
    if not matches:
        return None
    try:
        return float(matches[-1])
    except ValueError:
        return None


#: Most tokens a count may say: past it (or not finite) the engine's report is not believed
#: (a counter that reached 10**400 would break every later /metrics scrape).
_MAX_COUNT = 2**53


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    # Written so that NaN fails it too.
    if not 0 <= value <= _MAX_COUNT:
        return None
    return int(value)


def _rate(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return None
    rate = float(value)
    return round(rate, 2) if rate < 1e9 else None


class StatsReader:
    """Fed each body chunk with its arrival time; asked for :class:`Stats` at the end.

    :param admitted_at: admission time (seconds), for ``ttftMs``.
    """

    # One per stream in flight: no per-instance dictionary (docs/performance.md#held-streams).
    __slots__ = (
        "_admitted_at",
        "_carry",
        "_carry_overflowed",
        "_events",
        "_first_at",
        "_tail",
        "_tail_size",
    )

    def __init__(self, admitted_at: float) -> None:
        self._admitted_at = admitted_at
        # The body's last chunks, as relayed (not copied), holding its last TAIL_BYTES: a
        # window of references costs what those bytes cost, where a bytearray window keeps a
        # buffer of twice the window per stream (bench/README.md, held streams).
        self._tail: list[bytes] = []
        self._tail_size = 0
        self._carry = b""
        self._carry_overflowed = False
        self._events = 0
        self._first_at: float | None = None

    def feed(self, chunk: bytes, now: float) -> None:
        """One chunk of the body, as relayed."""
        if not chunk:
            return
        if self._first_at is None:
            self._first_at = now
        self._keep(chunk)
        if not self._carry and len(chunk) <= _LINE_CARRY and chunk.endswith(b"\n"):
            # Every line is whole and within the kept prefix: counted all at once.
            self._events += _content_pieces(chunk)
        else:
            self._count_events(chunk)

    def _keep(self, chunk: bytes) -> None:
        # Under 2 x TAIL_BYTES held: the oldest chunk goes once the rest hold the window.
        if len(chunk) >= TAIL_BYTES:
            self._tail = [chunk[-TAIL_BYTES:]]
            self._tail_size = TAIL_BYTES
            return
        tail = self._tail
        tail.append(chunk)
        size = self._tail_size + len(chunk)
        while size - len(tail[0]) >= TAIL_BYTES:
            size -= len(tail.pop(0))
        if len(tail) > _TAIL_PIECES:
            # A body dripped a few bytes at a time would make the window thousands of tiny
            # objects, each dearer than its bytes: joined into one instead.
            joined = b"".join(tail)[-TAIL_BYTES:]
            self._tail = [joined]
            size = len(joined)
        self._tail_size = size

    def _count_events(self, chunk: bytes) -> None:
        # An event is a line: an SSE "data:" line or an NDJSON object. Lines may span chunks,
        # so only a bounded prefix of the unfinished one is carried over, and every line is
        # judged by that same prefix: the count does not depend on where chunks were split.
        lines = chunk.split(b"\n")
        rest = lines.pop()
        if lines and self._carry:
            # The carried line ends here: judged as one.
            self._carry_append(lines.pop(0))
            self._event(self._carry, self._carry_overflowed)
            self._carry, self._carry_overflowed = b"", False
        if lines:
            # Whole lines: those within the kept prefix are counted at once (no piece spans a
            # line break, so the count of the lines joined is the sum of theirs), each longer
            # one as one piece. One scan per key for the read, not three calls per line.
            if max(map(len, lines)) <= _LINE_CARRY:
                self._events += _content_pieces(b"\n".join(lines))
            else:
                kept = [line for line in lines if len(line) <= _LINE_CARRY]
                self._events += len(lines) - len(kept) + _content_pieces(b"\n".join(kept))
        self._carry_append(rest)

    def _carry_append(self, piece: bytes) -> None:
        room = _LINE_CARRY - len(self._carry)
        if len(piece) > room:
            self._carry_overflowed = True
        self._carry += piece[: max(0, room)]

    def _event(self, line: bytes, overflowed: bool) -> None:
        # A line too long to keep is one piece of content by any measure that matters here.
        self._events += 1 if overflowed else _content_pieces(line)

    def finish(self, now: float) -> Stats | None:
        """The stats for the whole body (None when nothing could be measured)."""
        if self._carry:
            self._event(self._carry, self._carry_overflowed)
            self._carry, self._carry_overflowed = b"", False
        ttft = None
        if self._first_at is not None:
            ttft = max(0, round((self._first_at - self._admitted_at) * 1000))
        prompt, completion, rate, cached = self._report()
        estimated = False
        if completion is None and self._events:
            completion, estimated = self._events, True
        if rate is None and completion and self._first_at is not None:
            span = now - self._first_at
            rate = _rate(completion / span) if span >= MIN_SPAN else None
        if prompt is None and completion is None and ttft is None:
            return None
        if cached is not None and (prompt is None or cached > prompt):
            cached = None
        return Stats(prompt, completion, rate, ttft, estimated, cached)

    def _report(self) -> tuple[int | None, int | None, float | None, int | None]:
        """Token counts, decode rate and prompt tokens from cache from the engine's own report
        in the tail."""
        tail = b"".join(self._tail)[-TAIL_BYTES:]
        prompt = completion = cached = None
        rate: float | None = None
        usage = _last_object(tail, _USAGE, b'"usage"')
        if usage is not None:
            prompt = _count(usage.get("prompt_tokens", usage.get("input_tokens")))
            completion = _count(usage.get("completion_tokens", usage.get("output_tokens")))
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict):
                cached = _count(details.get("cached_tokens"))
        timings = _last_object(tail, _TIMINGS, b'"timings"')
        if timings is not None:
            cache_n = _count(timings.get("cache_n"))
            if prompt is None:
                # llama.cpp's prompt_n is what it evaluated: the prompt is that and cache_n.
                prompt_n = _count(timings.get("prompt_n"))
                prompt = prompt_n if prompt_n is None or cache_n is None else prompt_n + cache_n
            cached = cached if cached is not None else cache_n
            completion = (
                completion if completion is not None else _count(timings.get("predicted_n"))
            )
            rate = _rate(timings.get("predicted_per_second"))
        lmstats = _last_object(tail, _LMSTATS, b'"stats"')
        if lmstats is not None:
            # LM Studio: REST v0 "stats" carry the rate; REST v1 "stats" the counts as well.
            prompt = prompt if prompt is not None else _count(lmstats.get("input_tokens"))
            completion = (
                completion if completion is not None else _count(lmstats.get("total_output_tokens"))
            )
            rate = rate if rate is not None else _rate(lmstats.get("tokens_per_second"))
        has_count = tail.find(b'"eval_count"') >= 0
        eval_count = _last_number(tail, _OLLAMA["eval_count"]) if has_count else None
        if eval_count is not None:
            prompt_count = _last_number(tail, _OLLAMA["prompt_eval_count"])
            prompt = prompt if prompt is not None else _count(prompt_count)
            completion = completion if completion is not None else _count(eval_count)
            duration_ns = _last_number(tail, _OLLAMA["eval_duration"])
            if rate is None and duration_ns:
                rate = _rate(eval_count / (duration_ns / 1e9))
        return prompt, completion, rate, cached
