"""The multi-turn client: the stream parser alone, then one turn over a real loopback socket
against canned answers (a good stream, an error, a stream cut short, garbage)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest

from bench.chatclient import ChatStream, send_turn
from bench.chatresults import Turn

TIMINGS = {"cache_n": 700, "prompt_n": 312, "prompt_ms": 140.5, "predicted_n": 3}


def event(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def chunk(content: str | None = None, finish: str | None = None, **extra: object) -> bytes:
    delta = {} if content is None else {"content": content}
    return event({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra})


ROLE = event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]})
#: llama-server's stream without include_usage: timings ride on the finish chunk.
STREAM = (
    ROLE
    + chunk("Hel")
    + chunk("lo")
    + chunk(finish="length", timings=TIMINGS)
    + b"data: [DONE]\n\n"
)


def test_the_reply_the_timings_and_the_first_token() -> None:
    stream = ChatStream()
    assert stream.feed(ROLE) is False  # the role chunk is no token
    assert stream.feed(chunk("Hel")) is True
    assert stream.feed(chunk("lo")) is False  # only the first is the first
    stream.feed(chunk(finish="length", timings=TIMINGS) + b"data: [DONE]\n\n")
    assert (stream.reply, stream.timings, stream.done, stream.error) == ("Hello", TIMINGS, True, "")


def test_a_stream_split_anywhere_parses_the_same() -> None:
    for size in (1, 3, 7, 64):
        stream = ChatStream()
        firsts = [stream.feed(STREAM[i : i + size]) for i in range(0, len(STREAM), size)]
        assert firsts.count(True) == 1
        assert (stream.reply, stream.timings, stream.done) == ("Hello", TIMINGS, True)


def test_timings_on_a_usage_chunk_after_the_finish_are_taken() -> None:
    """With ``include_usage`` the timings come on the usage chunk, which has no choices."""
    stream = ChatStream()
    stream.feed(chunk("x") + chunk(finish="stop"))
    stream.feed(event({"choices": [], "usage": {}, "timings": TIMINGS}) + b"data: [DONE]\n\n")
    assert stream.timings == TIMINGS


def test_an_answer_that_finishes_at_once_has_its_first_token_at_the_finish() -> None:
    """A model may stop before any content (end of sequence): the finish is the first token."""
    stream = ChatStream()
    assert stream.feed(chunk(finish="stop", timings=TIMINGS)) is True
    assert stream.reply == ""


def test_an_error_event_and_garbage_are_errors_never_a_crash() -> None:
    stream = ChatStream()
    stream.feed(event({"error": {"code": 500, "message": "boom"}}))
    stream.feed(b"data: {not json\n\n" + event([1, 2]) + event({"choices": ["x", {"delta": 3}]}))
    assert "boom" in stream.error
    assert (stream.reply, stream.timings, stream.done) == ("", None, False)


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def canned(answer: bytes) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(answer)
        await writer.drain()
        writer.close()

    return handle


def chunked(payload: bytes, node: str = "n1") -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    head += f"X-Nvpair-Node: {node}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    return head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload)


async def turn_against(answer: bytes, timeout: float = 5) -> tuple[Turn, str]:
    server = await asyncio.start_server(canned(answer), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        return await send_turn(port, 3, 2, b"{}", timeout)


def test_a_turn_through_a_socket_measures_its_answer() -> None:
    turn, reply = asyncio.run(turn_against(chunked(STREAM)))
    assert reply == "Hello"
    assert turn.ok, turn
    assert (turn.conversation, turn.turn, turn.status, turn.node) == (3, 2, 200, "n1")
    assert (turn.prompt_n, turn.cache_n) == (312, 700)
    assert turn.ttft_ms is not None and turn.ttft_ms >= 0


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 11\r\n\r\nno capacity",
            "status 503: no capacity",
        ),
        (chunked(ROLE + chunk("a")), "without [DONE]"),
        (chunked(ROLE + chunk("a") + b"data: [DONE]\n\n"), "no timings"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n40\r\nshort", "ended early"),
        (b"SPAM\r\n\r\n", "bad status line"),
    ],
)
def test_a_bad_answer_is_a_failed_turn_with_its_reason(answer: bytes, why: str) -> None:
    turn, _ = asyncio.run(turn_against(answer))
    assert not turn.ok
    assert why in turn.error


def test_a_silent_server_is_a_timeout_not_a_hang() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client gives up and closes
        writer.close()

    async def run() -> tuple[Turn, str]:
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        async with server:
            return await send_turn(server.sockets[0].getsockname()[1], 0, 0, b"{}", 0.3)

    turn, _ = asyncio.run(run())
    assert turn.status is None and "TimeoutError" in turn.error
