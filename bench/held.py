"""Held streams: many long server-sent-event streams open at once through one proxy.

An asyncio client (no Twisted: the client must not share a design with what it measures) opens
``count`` streams at ``rate`` per second to loopback ports, reads each to its end and records
when every event arrived. Per stream: intact (status 200, every event, ``[DONE]`` last, a clean
end of body), time to the first event, and the worst gap between two events.

The wire parsing is pure (:class:`Dechunker`, :class:`Events`) and tested on its own.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Mapping, Sequence

import attrs

from bench.contenders import HEADERS, PATH, STREAM_BODY

MAX_HEAD = 64 * 1024
DONE = b"data: [DONE]\n\n"


class WireError(Exception):
    """The answer is not well-formed HTTP/1.1 (a broken stream, never a crash)."""


class Dechunker:
    """Incremental ``Transfer-Encoding: chunked`` decoding; :attr:`done` after the last chunk."""

    def __init__(self) -> None:
        self._buffer = b""
        self._left = 0  # payload bytes still due in the current chunk, then its CRLF
        self._crlf = False
        self.done = False

    def feed(self, data: bytes) -> bytes:
        """The payload bytes ``data`` completes (possibly none)."""
        self._buffer += data
        out: list[bytes] = []
        while not self.done:
            if self._left:
                piece = self._buffer[: self._left]
                out.append(piece)
                self._left -= len(piece)
                self._buffer = self._buffer[len(piece) :]
                if self._left:
                    break
                self._crlf = True
            if self._crlf:
                if len(self._buffer) < 2:
                    break
                if self._buffer[:2] != b"\r\n":
                    raise WireError("chunk not followed by CRLF")
                self._buffer = self._buffer[2:]
                self._crlf = False
            end = self._buffer.find(b"\r\n")
            if end < 0:
                if len(self._buffer) > 1024:
                    raise WireError("chunk size line too long")
                break
            size_text = self._buffer[:end].split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise WireError(f"bad chunk size {size_text[:20]!r}") from None
            if size < 0:
                raise WireError("negative chunk size")
            self._buffer = self._buffer[end + 2 :]
            if size == 0:
                # Trailers are not expected here; the terminating CRLF may come later.
                self.done = True
                break
            self._left = size
        return b"".join(out)


class Events:
    """Counts server-sent events (``\\n\\n``-terminated) in a payload fed piece by piece."""

    def __init__(self) -> None:
        self._tail = b""
        self.count = 0
        self.end = b""

    def feed(self, payload: bytes) -> int:
        """How many events ``payload`` completes."""
        data = self._tail + payload
        found = data.count(b"\n\n")
        self.count += found
        # An odd run of newlines at the end leaves one that the next piece may complete.
        run = len(data) - len(data.rstrip(b"\n"))
        self._tail = b"\n" if run % 2 else b""
        self.end = (self.end + payload)[-len(DONE) :]
        return found

    @property
    def finished(self) -> bool:
        """Whether the last event so far is ``[DONE]``."""
        return self.end == DONE


@attrs.frozen
class StreamResult:
    """One held stream.

    :param intact: status 200, ``expected`` events, ``[DONE]`` last, and a clean end.
    :param ttfb: seconds from starting to connect to the first event (None: none came).
    :param worst_gap: the longest wait between two events, seconds (None: under two events).
    """

    intact: bool
    events: int
    ttfb: float | None
    worst_gap: float | None
    error: str = ""


def _head(raw: bytes) -> tuple[int, dict[bytes, bytes]]:
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise WireError(f"bad status line {lines[0][:40]!r}")
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise WireError("bad header line")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    """An answer's status and headers (names lower-cased)."""
    raw = await reader.readuntil(b"\r\n\r\n")
    if len(raw) > MAX_HEAD:
        raise WireError("header too long")
    return _head(raw[:-4])


async def read_body(
    reader: asyncio.StreamReader, headers: Mapping[bytes, bytes]
) -> AsyncIterator[bytes]:
    """The answer's body as it arrives (chunked, sized or up to the close); WireError when it
    ends before it should."""
    chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
    length = headers.get(b"content-length")
    remaining = int(length) if length is not None and not chunked else -1
    dechunker = Dechunker()
    while remaining != 0 and not (chunked and dechunker.done):
        data = await reader.read(65536)
        if not data:
            if chunked or remaining > 0:
                raise WireError("the answer ended early")
            break
        payload = dechunker.feed(data) if chunked else data
        if remaining > 0:
            remaining -= len(payload)
        yield payload


def request_bytes(port: int) -> bytes:
    head = [f"POST {PATH} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    head += [f"{name}: {value}" for name, value in HEADERS.items()]
    head.append(f"Content-Length: {len(STREAM_BODY)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + STREAM_BODY


async def one_stream(port: int, expected: int, timeout: float) -> StreamResult:
    """Open one stream to ``port`` and read it to its end (or ``timeout`` seconds)."""
    started = time.monotonic()
    times: list[float] = []
    events = Events()
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(request_bytes(port))
                raw = await reader.readuntil(b"\r\n\r\n")
                if len(raw) > MAX_HEAD:
                    raise WireError("header too long")
                status, headers = _head(raw[:-4])
                if status != 200:
                    return StreamResult(False, 0, None, None, f"status {status}")
                chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
                length_text = headers.get(b"content-length")
                remaining = int(length_text) if length_text is not None and not chunked else -1
                dechunker = Dechunker()
                clean = False
                while True:
                    data = await reader.read(65536)
                    now = time.monotonic()
                    if not data:
                        clean = not chunked and remaining < 0  # close-delimited body
                        break
                    payload = dechunker.feed(data) if chunked else data
                    if remaining >= 0:
                        remaining -= len(payload)
                    times.extend([now] * events.feed(payload))
                    if (chunked and dechunker.done) or remaining == 0:
                        clean = True
                        break
            finally:
                writer.close()
    except (TimeoutError, OSError, ValueError, WireError, asyncio.IncompleteReadError) as error:
        return _result(False, events, times, started, f"{type(error).__name__}: {error}"[:120])
    intact = clean and events.count == expected and events.finished
    return _result(intact, events, times, started, "" if intact else "incomplete")


def _result(
    intact: bool, events: Events, times: Sequence[float], started: float, error: str
) -> StreamResult:
    ttfb = times[0] - started if times else None
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return StreamResult(intact, events.count, ttfb, max(gaps) if gaps else None, error)


async def held(
    ports: Sequence[int], count: int, rate: float, expected: int, timeout: float
) -> list[StreamResult]:
    """Open ``count`` streams at ``rate`` a second (round robin over ``ports``), all held open
    together, and wait for every one to end."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks: list[asyncio.Task[StreamResult]] = []
    for index in range(count):
        delay = start + index / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        port = ports[index % len(ports)]
        tasks.append(asyncio.create_task(one_stream(port, expected, timeout)))
    return list(await asyncio.gather(*tasks))


def run_held(
    ports: Sequence[int], count: int, rate: float, expected: int, timeout: float
) -> list[StreamResult]:
    return asyncio.run(held(ports, count, rate, expected, timeout))
