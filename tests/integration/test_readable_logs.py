"""Logs a person can read (issue 20): ``--log-format``, Twisted's lines in the process's words,
and ``--access-log``, read back from the real process's stderr (docs/README.md#logging)."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor

from tests.httpwire import talk
from tests.integration.conftest import running_proxy, sims
from tests.integration.harness import TWISTD, ProxyProcess, free_port, write_fleet
from tests.integration.test_console_script import clean_env, read_until
from tests.integration.test_fleet import eventually

#: A text record's start: local time to the millisecond, then the level in five columns.
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (?:debug|info |warn |error) (.*)")

#: What a person never reads where a word belongs: Twisted's class names and its own phrasing.
NOT_WORDS = (
    "Factory",
    "Site",
    "Reactor",
    "reactor class",
    "twisted.",
    "Port ",
    "starting on",
    "Main loop",
    "Shut Down",
    "starting up",
)


def stderr_lines(proxy: ProxyProcess) -> list[str]:
    return proxy.raw_stderr.decode().splitlines()


async def said(proxy: ProxyProcess, pattern: str) -> str:
    """The first stderr line (already written or still to come) that ``pattern`` finds."""
    found: list[str] = []

    async def written() -> bool:
        found[:] = [line for line in stderr_lines(proxy) if re.search(pattern, line)]
        return bool(found)

    await eventually(written, lambda: proxy.raw_stderr.decode()[-3000:])
    return found[0]


def messages(lines: list[str], fmt: str) -> list[str]:
    """Each record's message (text: what follows the level; JSON: ``msg``)."""
    if fmt == "json":
        return [json.loads(line)["msg"] for line in lines]
    out = []
    for line in lines:
        match = TEXT_LINE.fullmatch(line)
        assert match is not None, f"not a text record: {line!r}"
        out.append(match.group(1))
    return out


async def completion(port: int, query: str = "") -> int:
    body = json.dumps({"model": "tiny", "prompt": "hello", "stream": False}).encode()
    response = await treq.post(f"http://127.0.0.1:{port}/completion{query}", body, timeout=10)
    await response.content()
    return int(response.code)


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest_twisted.ensureDeferred
async def test_a_failover_read_back_from_the_log(tmp_path: Path, fmt: str) -> None:
    """A fleet's start, a request that fails over (node a answers 503), SIGHUP and stop: every
    line a record in the chosen format, in words, the failover on the request's access line."""
    async with sims(("llamacpp", ["tiny"], "a"), ("llamacpp", ["tiny"], "b")) as (a, b):
        a.faults.status = 503
        port, admin = free_port(), free_port()
        fleet = write_fleet(tmp_path / "fleet.toml", port, {"a": a.url, "b": b.url}, "llamacpp")
        args = [
            *("--fleet", str(fleet), "--log-format", fmt, "--access-log"),
            *("--admin-port", str(admin), "--retry-backoff", "50ms"),
        ]
        async with running_proxy(tmp_path / "run", *args) as proxy:
            await said(proxy, "a joined llamacpp")
            await said(proxy, "b joined llamacpp")
            failover = ""
            for _ in range(5):  # a is first in the file; a request it takes fails over to b
                assert await completion(port, "?user=someone") == 200
                lines = [
                    line
                    for line in stderr_lines(proxy)
                    if '"attempts":2' in line or ("attempts=2" in line)
                ]
                if lines:
                    failover = lines[0]
                    break
            assert failover, proxy.raw_stderr.decode()[-3000:]
            assert len(a.requests) >= 1 and len(b.requests) >= 1
            assert proxy.transport is not None
            proxy.transport.signalProcess("HUP")
            await said(proxy, "fleet file reloaded")
        assert proxy.exit_code is not None

    lines = stderr_lines(proxy)
    said_all = messages(lines, fmt)
    for message in said_all:
        assert not [word for word in NOT_WORDS if word in message], message
    if fmt == "text":
        assert re.fullmatch(
            r".* info  POST /completion 200 engine=llamacpp facade=llamacpp route=inference "
            r"outcome=served node=b attempts=2 ttfb_ms=[\d.]+ duration_ms=[\d.]+ "
            # A first prompt: its conversation is new to the fleet (docs/fleet-scheduling.md
            # #what-the-operator-sees-of-affinity).
            r"client=127\.0\.0\.1 affinity=new",
            failover,
        ), failover
    else:
        record = json.loads(failover)
        assert (record["msg"], record["level"], record["path"]) == (
            "POST /completion 200",
            "info",
            "/completion",
        )
        assert (record["node"], record["attempts"], record["status"]) == ("b", 2, 200)
        assert record["ttfb_ms"] <= record["duration_ms"] and "key" not in record
    assert "user=someone" not in proxy.raw_stderr.decode()
    expected = [
        r"nvpair-proxy \S+ starting \(Twisted \S+, Python \S+\)",
        r"event loop: \w",
        rf"llamacpp facade listening on {port}$",
        rf"admin listener on 127\.0\.0\.1:{admin}$",
        r"POST /completion 200",
        r"fleet file reloaded",
        r"Received SIGTERM, shutting down\.",
        r"nvpair-proxy stopped$",
    ]
    at = 0
    for message in said_all:
        if at < len(expected) and re.match(expected[at], message):
            at += 1
    assert at == len(expected), (expected[at:], said_all)
    assert said_all[-1] == "nvpair-proxy stopped"


def _raw(request: bytes) -> bytes:
    return request.replace(b"\n", b"\r\n")


@pytest_twisted.ensureDeferred
async def test_requests_refused_before_admission_are_access_lines(tmp_path: Path) -> None:
    """Refused at the head (403, 413, 501 for bytes that are no request) or for the body (400):
    each a finished request with its line, the path without its query."""
    async with sims(("ollama", ["llama3:latest"], "a")) as (a,):
        port = free_port()
        fleet = write_fleet(tmp_path / "fleet.toml", port, {"a": a.url})
        args = ("--fleet", str(fleet), "--access-log")
        async with running_proxy(tmp_path / "run", *args) as proxy:
            await said(proxy, "a joined ollama")
            exchanges = [
                b"GET /api/tags?k=v HTTP/1.1\nHost: evil.example\n\n",
                b"POST /api/chat HTTP/1.1\nHost: localhost\nContent-Length: 999999999999\n\n",
                b"NOT HTTP AT ALL\n\n",
                b"POST /api/chat HTTP/1.1\nHost: localhost\nConnection: close\n"
                b"Content-Length: 3\n\nabc",
            ]
            for exchange in exchanges:
                await talk(reactor, port, _raw(exchange))
            await proxy.wait_for_log(lambda r: r.get("outcome") == "bad-json")
    access = [r for r in proxy.logs if r.get("namespace", "").startswith("nvpair.facades.access")]
    seen = [
        (r.get("method"), r.get("path"), r["status"], r["outcome"], r.get("route"), r["msg"])
        for r in access
    ]
    assert seen == [
        ("GET", "/api/tags", 403, "forbidden-host", None, "GET /api/tags 403"),
        ("POST", "/api/chat", 413, "body-too-large", None, "POST /api/chat 413"),
        (None, None, 501, "not-implemented", None, "unreadable request: 501"),
        ("POST", "/api/chat", 400, "bad-json", "inference", "POST /api/chat 400"),
    ]
    assert all(r["level"] == "info" and r["engine"] == "ollama" for r in access)
    assert all("node" not in r and "attempts" not in r for r in access)


def _start(tmp_path: Path, stderr: Any) -> subprocess.Popen[bytes]:
    fleet = write_fleet(tmp_path / "fleet.toml", free_port(), {})
    return subprocess.Popen(
        [TWISTD, "--pidfile=", "-n", "nvpair-proxy", "--fleet", str(fleet)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        cwd=tmp_path,
        env=clean_env(),
    )


def test_the_default_is_text_on_a_terminal(tmp_path: Path) -> None:
    """With stderr a terminal and no --log-format, every line is a text record. (On a pipe the
    default is JSON: test_console_script.py::test_a_brokers_pipe_gets_no_terminal_hint.)"""
    controller, terminal = pty.openpty()
    proxy = _start(tmp_path, terminal)
    os.close(terminal)
    with os.fdopen(controller, "rb", buffering=0) as screen:
        try:
            seen = read_until(screen, b"facade listening")
        finally:
            proxy.terminate()
            proxy.wait(timeout=30)
    lines = seen.decode().replace("\r\n", "\n").splitlines()
    assert lines and any("facade listening" in line for line in lines), seen
    for line in lines:
        assert TEXT_LINE.fullmatch(line), line
