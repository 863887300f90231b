"""User-space instructions per proxied request, counted by valgrind's callgrind.

Seconds of CPU swing with whatever else the two cores are doing; instructions do not: the same
binary, requests and environment give the same count to within about 1 %, with the other core
busy or not. So small differences — what counting for ``/metrics`` costs, what a change to the
hot path bought — are judged on instructions (bench/README.md, "Instructions per request").

Each contender runs under callgrind in front of the two simulated nodes (which run natively)
and serves ``warmup`` requests, then ``few`` or ``many`` more, sequentially on one kept-alive
connection; the difference of the two totals over ``many - few`` is the cost of one request,
with start-up and shutdown cancelled out. Kernel time (system calls) is not counted.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from httptools.parser.parser import HttpResponseParser

from bench.contenders import BODY, PATH, Setup, floor_argv, nvpair_argv
from bench.procs import ROOT, free_port, wait_for

#: Contenders measured, and how each one's command line is made.
ARGV: dict[str, Callable[[Setup, Path, int], list[str]]] = {
    "nvpair": lambda setup, work, port: nvpair_argv(setup, work, port),
    "nvpair+metrics": lambda setup, work, port: nvpair_argv(setup, work, port, metrics=True),
    "floor": lambda setup, work, port: floor_argv(setup, port),
}

_TOTAL = re.compile(rb"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


def available() -> bool:
    return shutil.which("valgrind") is not None


def answered(port: int, seconds: float = 300) -> None:
    """Until one request through ``port`` is answered 200: the first inventory poll is done
    (slow under callgrind)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            serve(port, 1)
            return
        except (OSError, RuntimeError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def serve(port: int, count: int, body: bytes = BODY) -> None:
    """``count`` non-streaming requests, one after another, on one kept-alive connection."""
    request = (
        f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", port), timeout=60) as connection:
        for _ in range(count):
            answer = _Answer()
            parser = HttpResponseParser(answer)
            connection.sendall(request)
            while not answer.complete:
                data = connection.recv(65536)
                if not data:
                    raise RuntimeError("the proxy closed the connection")
                parser.feed_data(data)
            if parser.get_status_code() != 200:
                raise RuntimeError(f"the proxy answered {parser.get_status_code()}")


class _Answer:
    """llhttp's callbacks for one answer: only its end matters."""

    def __init__(self) -> None:
        self.complete = False

    def on_message_complete(self) -> None:
        self.complete = True


def total(
    argv: Sequence[str], work: Path, port: int, warmup: int, count: int, body: bytes = BODY
) -> int:
    """Instructions callgrind counted in the process of ``argv`` serving ``count`` requests
    of ``body`` after ``warmup``."""
    out = work / f"callgrind.{count}"
    child = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(port, 300)
        answered(port)
        serve(port, warmup, body)
        serve(port, count, body)
    finally:
        child.terminate()
        child.wait(timeout=120)
    found = _TOTAL.search(out.read_bytes())
    if found is None:
        raise RuntimeError(f"no instruction total in {out}")
    return int(found.group(1))


def per_request(
    name: str,
    setup: Setup,
    work: Path,
    few: int = 100,
    many: int = 600,
    warmup: int = 20,
    body: bytes = BODY,
) -> float:
    """Instructions one request of ``body`` costs ``name`` (see the module docstring): a
    streamed one with :data:`bench.contenders.STREAM_BODY` in front of nodes that stream as
    many tokens as the stream should have."""
    totals = []
    for count in (few, many):
        sub = work / f"{name}-{count}"
        sub.mkdir(parents=True)
        port = free_port()
        totals.append(total(ARGV[name](setup, sub, port), sub, port, warmup, count, body))
    return (totals[1] - totals[0]) / (many - few)
