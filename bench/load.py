"""Load generators over loopback: sequential latency, ``wrk`` at a fixed concurrency, and
time to first byte of a stream on a fresh connection. Each is bounded in count and time.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from http.client import HTTPConnection, HTTPException
from pathlib import Path

import attrs

from bench.contenders import BODY, HEADERS, KEY, PATH, STREAM_BODY


def latency(port: int, count: int, warmup: int = 50) -> list[float]:
    """Milliseconds per non-streaming request, one at a time on one keep-alive connection."""
    connection = HTTPConnection("127.0.0.1", port, timeout=30)
    samples = []
    try:
        for index in range(count + warmup):
            started = time.perf_counter()
            connection.request("POST", PATH, BODY, HEADERS)
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"status {response.status}")
            if index >= warmup:
                samples.append((time.perf_counter() - started) * 1000)
    finally:
        connection.close()
    return samples


@attrs.frozen
class WrkRun:
    """What ``wrk`` reported: completed requests, their rate, and anything that went wrong."""

    requests: int
    rate: float
    errors: int

    @staticmethod
    def parse(out: str) -> WrkRun:
        done = re.search(r"^\s*(\d+) requests in", out, re.M)
        rate = re.search(r"^Requests/sec:\s*([\d.]+)", out, re.M)
        if done is None or rate is None:
            raise RuntimeError(f"unreadable wrk output: {out[-300:]!r}")
        errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
        bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        return WrkRun(
            int(done.group(1)), float(rate.group(1)), errors + int(bad.group(1) if bad else 0)
        )


def wrk_available() -> bool:
    return shutil.which("wrk") is not None


def wrk(port: int, seconds: float, connections: int, work: Path, stream: bool) -> WrkRun:
    """``wrk -t1 -cN`` POSTing the non-streaming or the streaming body."""
    binary = shutil.which("wrk")
    if binary is None:
        raise RuntimeError("wrk is not installed (Debian package wrk)")
    body = STREAM_BODY if stream else BODY
    script = work / ("stream.lua" if stream else "post.lua")
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {KEY}"\n'
        f"wrk.body = {json.dumps(body.decode())}\n"
    )
    # wrk takes whole seconds only ("-d5.0s" is a usage error).
    argv = [binary, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s"]
    argv += ["-s", str(script), f"http://127.0.0.1:{port}{PATH}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    return WrkRun.parse(done.stdout)


def first_byte(port: int, timeout: float) -> float | None:
    """Milliseconds from connecting to the first body byte of a streamed answer on a fresh
    connection; None when there was no 200 with a body within ``timeout``."""
    started = time.perf_counter()
    connection = HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", PATH, STREAM_BODY, HEADERS)
        response = connection.getresponse()
        if response.status != 200 or not response.read(1):
            return None
        elapsed = (time.perf_counter() - started) * 1000
        response.read()
        return elapsed
    except (TimeoutError, OSError, HTTPException):
        return None
    finally:
        connection.close()
