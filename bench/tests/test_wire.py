"""The held-stream client's wire parsing: chunked decoding and event counting, however the
bytes are split."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.held import DONE, Dechunker, Events, WireError, _head
from bench.load import WrkRun


def chunked(payload: bytes, sizes: list[int]) -> bytes:
    out, rest = [], payload
    for size in sizes:
        if not rest:
            break
        piece, rest = rest[: max(size, 1)], rest[max(size, 1) :]
        out.append(b"%x\r\n%s\r\n" % (len(piece), piece))
    if rest:
        out.append(b"%x;ext=1\r\n%s\r\n" % (len(rest), rest))
    return b"".join(out) + b"0\r\n\r\n"


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@given(
    st.binary(max_size=300),
    st.lists(st.integers(1, 40), max_size=10),
    st.lists(st.integers(0, 10_000), max_size=20),
)
def test_dechunker_recovers_the_payload_however_it_is_read(
    payload: bytes, sizes: list[int], cuts: list[int]
) -> None:
    dechunker = Dechunker()
    out = b"".join(dechunker.feed(piece) for piece in split(chunked(payload, sizes), cuts))
    assert out == payload
    assert dechunker.done


@pytest.mark.parametrize(
    "wire",
    [b"zz\r\nab\r\n", b"2\r\nabXY", b"-1\r\n", b"1" * 2000],
    ids=["bad-size", "no-crlf-after-chunk", "negative", "endless-size-line"],
)
def test_dechunker_refuses_malformed_framing(wire: bytes) -> None:
    """A broken stream is a WireError (the stream counts as broken), never a crash or a hang."""
    with pytest.raises(WireError):
        Dechunker().feed(wire)


EVENT = b'data: {"choices":[{"delta":{"content":" tok"}}]}\n\n'


@given(st.integers(0, 70), st.lists(st.integers(0, 100_000), max_size=30))
def test_events_are_counted_however_the_stream_is_split(count: int, cuts: list[int]) -> None:
    stream = EVENT * count + DONE
    events = Events()
    total = sum(events.feed(piece) for piece in split(stream, cuts))
    assert total == events.count == count + 1
    assert events.finished


def test_events_without_done_last_are_not_finished() -> None:
    events = Events()
    events.feed(DONE + EVENT)
    assert events.count == 2
    assert not events.finished


def test_status_line_and_headers() -> None:
    status, headers = _head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: b")
    assert status == 200
    assert headers[b"transfer-encoding"] == b"chunked"
    with pytest.raises(WireError):
        _head(b"SSH-2.0-OpenSSH\r\n")
    with pytest.raises(WireError):
        _head(b"HTTP/1.1 200 OK\r\nno colon here")


WRK = """Running 3s test @ http://127.0.0.1:4242/v1/chat/completions
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    14.44ms    2.01ms  30.13ms   80.12%
    Req/Sec     2.23k   150.12     2.45k    70.00%
  6683 requests in 3.00s, 5.49MB read
{errors}Requests/sec:   2225.41
Transfer/sec:      1.83MB
"""


def test_wrk_output_is_read() -> None:
    run = WrkRun.parse(WRK.format(errors=""))
    assert (run.requests, run.rate, run.errors) == (6683, 2225.41, 0)


def test_wrk_errors_and_bad_statuses_are_counted() -> None:
    errors = (
        "  Socket errors: connect 0, read 3, write 0, timeout 2\n  Non-2xx or 3xx responses: 5\n"
    )
    assert WrkRun.parse(WRK.format(errors=errors)).errors == 10


def test_unreadable_wrk_output_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        WrkRun.parse("wrk: command crashed")
