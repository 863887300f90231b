"""The multi-turn bench's client: conversations played through a proxy, each turn streamed.

An asyncio client (no Twisted: the client must not share a design with what it measures). Each
conversation is a task of its own: it waits for its start, sends its turns one after another on a
connection each, appends the assistant's actual answer to the history, and thinks before the next
message. Per turn it records the status, the node that answered (``X-Nvpair-Node``), the time from
starting to connect to the first token, and the engine's own ``timings`` (llama.cpp puts them on
the finish chunk of a stream, or on the usage chunk after it when one is asked for).

The stream parsing is pure (:class:`ChatStream`) and tested on its own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import attrs

from bench.chatresults import Turn
from bench.conversations import ChatMix, Conversation, history, request_body
from bench.held import WireError, read_body, read_head

PATH = "/v1/chat/completions"
#: Seconds one turn may take, queueing behind other conversations included, before it fails.
TURN_TIMEOUT = 180.0
#: The most bytes of an error answer kept to say what it was.
ERROR_SNIPPET = 160


class ChatStream:
    """An OpenAI-shaped chat completion stream (server-sent events) fed piece by piece.

    :attr:`reply` is the content so far, :attr:`timings` the last ``timings`` object seen,
    :attr:`error` the first ``error`` event's message, :attr:`done` whether ``[DONE]`` came.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._parts: list[str] = []
        self.timings: dict[str, object] | None = None
        self.error = ""
        self.done = False
        self.started = False

    @property
    def reply(self) -> str:
        return "".join(self._parts)

    def feed(self, payload: bytes) -> bool:
        """Parse what ``payload`` completes; True when it holds the first token (the first
        content, or a finish before any)."""
        self._buffer += payload
        first = False
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                break
            event, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    first |= self._data(line[5:].strip())
        return first

    def _data(self, data: bytes) -> bool:
        if data == b"[DONE]":
            self.done = True
            return False
        try:
            chunk = json.loads(data)
        except ValueError:
            self.error = self.error or f"not JSON: {data[:40]!r}"
            return False
        if not isinstance(chunk, dict):
            return False
        if "error" in chunk:
            self.error = self.error or str(chunk["error"])[:ERROR_SNIPPET]
        timings = chunk.get("timings")
        if isinstance(timings, dict):
            self.timings = timings
        token = False
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            content = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(content, str) and content:
                self._parts.append(content)
                token = True
            token |= choice.get("finish_reason") is not None
        first = token and not self.started
        self.started |= token
        return first


@attrs.define
class Answer:
    """What has come of one request so far: its status and headers, when its first token came
    (the event loop's clock), and why it failed when it did."""

    status: int | None = None
    headers: dict[bytes, bytes] = attrs.field(factory=dict)
    first: float | None = None
    error: str = ""


#: What a request can fail with on the way (its own timeout included).
FAILURES = (TimeoutError, OSError, ValueError, WireError, asyncio.IncompleteReadError)


async def exchange(port: int, request: bytes, stream: ChatStream, answer: Answer) -> None:
    """Send ``request`` on a connection of its own to ``port`` and read the answer to its end,
    a 200's body fed to ``stream``; what is seen goes into ``answer`` as it comes, so that a
    caller whose wait ends first (a timeout, a cancellation) keeps it. Raises what
    :data:`FAILURES` names."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        answer.status, answer.headers = await read_head(reader)
        kept = b""
        async for payload in read_body(reader, answer.headers):
            if answer.status != 200:
                kept = (kept + payload)[:ERROR_SNIPPET]
            elif stream.feed(payload) and answer.first is None:
                answer.first = loop.time()
        if answer.status != 200:
            answer.error = f"status {answer.status}: {kept.decode('utf-8', 'replace')}"
    finally:
        writer.close()


def request_bytes(port: int, body: bytes) -> bytes:
    head = [
        f"POST {PATH} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Connection: close",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _count(timings: dict[str, object] | None, key: str) -> int | None:
    value = None if timings is None else timings.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def send_turn(
    port: int, conversation: int, turn: int, body: bytes, timeout: float = TURN_TIMEOUT
) -> tuple[Turn, str]:
    """One streamed turn through ``port``: what it measured, and the assistant's reply."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    stream = ChatStream()
    answer = Answer()
    try:
        async with asyncio.timeout(timeout):
            await exchange(port, request_bytes(port, body), stream, answer)
    except FAILURES as failure:
        answer.error = f"{type(failure).__name__}: {failure}"[:ERROR_SNIPPET]
    status, first, error = answer.status, answer.first, answer.error
    node = answer.headers.get(b"x-nvpair-node", b"").decode("latin-1")
    if not error and not stream.done:
        error = stream.error or "the stream ended without [DONE]"
    error = error or stream.error
    if not error and stream.timings is None:
        error = "no timings in the answer"
    ttft = (first - started) * 1000 if first is not None else None
    measured = Turn(
        conversation,
        turn,
        status,
        node,
        ttft,
        _count(stream.timings, "prompt_n"),
        _count(stream.timings, "cache_n"),
        error,
        loop.time() - started,
    )
    return measured, stream.reply


async def _converse(
    port: int, model: str, conversation: Conversation, mix: ChatMix, start: float
) -> list[Turn]:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start + conversation.start - loop.time()))
    replies: list[str] = []
    turns: list[Turn] = []
    for index in range(len(conversation.messages)):
        if index:
            await asyncio.sleep(conversation.thinks[index - 1])
        body = request_body(model, history(conversation, replies, index), mix.max_tokens)
        measured, reply = await send_turn(port, conversation.index, index, body)
        turns.append(measured)
        if not measured.ok:
            # The conversation cannot go on without its answer: the rest are not sent.
            turns += [
                Turn(conversation.index, later, None, "", None, None, None, "not sent")
                for later in range(index + 1, len(conversation.messages))
            ]
            break
        replies.append(reply)
    return turns


async def _play(
    port: int, model: str, conversations: Sequence[Conversation], mix: ChatMix
) -> list[Turn]:
    start = asyncio.get_running_loop().time()
    tasks = [_converse(port, model, c, mix, start) for c in conversations]
    played = await asyncio.gather(*tasks)
    return [turn for turns in played for turn in turns]


def play(port: int, model: str, conversations: Sequence[Conversation], mix: ChatMix) -> list[Turn]:
    """Every conversation through ``port``, each from its start time; every turn's record."""
    return asyncio.run(_play(port, model, conversations, mix))
