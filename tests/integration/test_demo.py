"""`make demo`: the proxy standalone on etc/demo-fleet.toml; every facade streams an answer,
the demo's own checks ran, and its way of failing a node makes the proxy fail over."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

import pytest

from nvpair.demo import ADMIN_PORT, CHECKS, FACADES, SIMULATED

CHATS = {
    "ollama": ("/api/chat", {"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}),
    "lmstudio": (
        "/v1/chat/completions",
        {
            "model": "qwen2.5-7b-instruct",
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        },
    ),
    "llamacpp": (
        "/v1/chat/completions",
        {"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
    ),
}


def _busy(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _generate_on(port: int) -> tuple[int, str | None]:
    """A non-streamed llama3 request to the Ollama facade: its status and X-Nvpair-Node."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/generate",
        data=json.dumps({"model": "llama3", "prompt": "hi", "stream": False}).encode(),
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
            return response.status, response.headers.get("X-Nvpair-Node")
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("X-Nvpair-Node")


def _skip_unless_the_demos_ports_are_free() -> None:
    ports = [*FACADES.values(), *(port for _, port, _, _ in SIMULATED), ADMIN_PORT]
    if any(_busy(port) for port in ports):
        pytest.skip(f"the demo's fixed ports {ports} are not all free on this machine")


def _start_demo(tmp_path: Path) -> tuple[subprocess.Popen[str], str, Path]:
    """``python -m nvpair.demo`` (the recipe of ``make demo``), once its banner is printed:
    the process, the banner, and the state directory the banner names. Its stderr (its own
    lines and the proxy's log) goes to ``tmp_path/stderr``: a pipe nobody reads would fill."""
    _skip_unless_the_demos_ports_are_free()
    with (tmp_path / "stderr").open("w") as err:
        demo = subprocess.Popen(
            [sys.executable, "-m", "nvpair.demo"],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    assert demo.stdout is not None
    banner = ""
    deadline = time.monotonic() + 60
    while "Ctrl-C" not in banner and time.monotonic() < deadline:
        line = demo.stdout.readline()
        if not line:
            break
        banner += line
    found = re.search(r"state in (/\S+) \(removed at the end\)", banner)
    if found is None:
        demo.kill()
        demo.communicate()
        said = (tmp_path / "stderr").read_text()[-2000:]
        raise AssertionError(f"no banner naming the state directory: {banner!r} {said}")
    return demo, banner, Path(found.group(1))


def _ended(demo: subprocess.Popen[str], tmp_path: Path) -> tuple[int, str]:
    """The demo's exit status and what it said on stderr (the proxy's log lines and its own)."""
    demo.communicate(timeout=30)
    return demo.returncode, (tmp_path / "stderr").read_text()


def _everything_stopped() -> None:
    """Every child stopped with the demo: no port of the demo's listens any more."""
    ports = [*FACADES.values(), *(port for _, port, _, _ in SIMULATED), ADMIN_PORT]
    assert [port for port in ports if _busy(port)] == []


def test_demo_streams_through_every_facade(tmp_path: Path) -> None:
    demo, banner, state = _start_demo(tmp_path)
    try:
        assert state.is_dir()
        assert "curl" in banner
        # The demo's own checks ran: each facade's model list, and an inference a node answered.
        for check in CHECKS.values():
            assert re.search(rf"{re.escape(check.name)} +http://127\.0\.0\.1:\d+ +models: ", banner)
            assert f"{check.inference['model']}: 200 from node-a (X-Nvpair-Node)" in banner
        # The status page's address beside the curl lines, and the page is there.
        page = f"http://127.0.0.1:{ADMIN_PORT}/"
        assert re.search(rf"^  {re.escape(page)}$", banner, re.M), banner
        with urllib.request.urlopen(page, timeout=10) as got:
            assert got.headers.get_content_type() == "text/html"
        for engine, (path, body) in CHATS.items():
            request = urllib.request.Request(
                f"http://127.0.0.1:{FACADES[engine]}{path}",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                pieces = []
                while chunk := response.read1():
                    pieces.append(chunk)
            text = b"".join(pieces)
            assert response.status == 200, engine
            assert b"node-a" in text or b"node-b" in text, engine
            assert len(pieces) > 1, f"{engine} answer was not streamed"
        # Failover as the banner shows it: node-a's fault knob, then node-b answers llama3.
        knob = re.search(r"kill -USR1 (\d+) +node-a answers every inference 503", banner)
        assert knob is not None, banner
        assert _generate_on(FACADES["ollama"]) == (200, "node-a")
        os.kill(int(knob.group(1)), signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while _generate_on(FACADES["ollama"]) != (200, "node-b"):
            assert time.monotonic() < deadline, "no failover to node-b"
            time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{ADMIN_PORT}/status", timeout=10) as got:
            status = json.loads(got.read())
        assert {n["id"] for n in status["nodes"]["ollama"]} == {"node-a", "node-b"}
    finally:
        demo.send_signal(signal.SIGINT)
        assert _ended(demo, tmp_path)[0] == 0
    # Ctrl-C: everything stopped, and nothing left behind.
    assert not state.exists()
    _everything_stopped()


def test_sigterm_ends_the_demo_and_removes_its_directory(tmp_path: Path) -> None:
    """SIGTERM (a service manager, ``kill``) ends the demo as Ctrl-C does."""
    demo, _, state = _start_demo(tmp_path)
    assert state.is_dir()
    demo.send_signal(signal.SIGTERM)
    assert _ended(demo, tmp_path)[0] == 0
    assert not state.exists()
    _everything_stopped()


def test_a_child_that_dies_ends_the_demo_and_removes_its_directory(tmp_path: Path) -> None:
    """The demo's own end, when one of its processes dies: it says which, stops the others,
    removes its directory and exits 1."""
    demo, banner, state = _start_demo(tmp_path)
    knob = re.search(r"kill -USR1 (\d+) +the same for node-b", banner)
    assert knob is not None, banner
    os.kill(int(knob.group(1)), signal.SIGKILL)
    status, err = _ended(demo, tmp_path)
    assert status == 1
    assert f"demo: node-b's simulator ended (exit status {-signal.SIGKILL}): stopping" in err
    assert not state.exists()
    _everything_stopped()


class _Lines:
    """Lines read from a child's pipe, each once, with bounded waits."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._buffer = b""

    def until(self, marker: bytes, timeout: float = 20) -> bytes:
        """The next whole line containing ``marker``; lines before it are passed over."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                if marker in line:
                    return line
            if time.monotonic() >= deadline:
                raise AssertionError(f"no {marker!r} line: {self._buffer!r}")
            ready, _, _ = select.select([self._stream], [], [], 0.2)
            if ready:
                chunk = os.read(self._stream.fileno(), 4096)
                if not chunk:
                    raise AssertionError(f"no {marker!r} line before EOF")
                self._buffer += chunk


def _status(url: str) -> int | str:
    request = urllib.request.Request(
        url, data=json.dumps({"model": "llama3", "prompt": "hi", "stream": False}).encode()
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except urllib.error.URLError as error:
        return type(error.reason).__name__


def test_sim_fault_knobs_by_signal() -> None:
    """`python -m nvpair.sim`: SIGUSR1 turns failing (503) on and off, SIGUSR2 "gone"
    (connections refused) on and off: the knobs the demo tells its user to use."""
    sim = subprocess.Popen(
        [sys.executable, "-m", "nvpair.sim", "--serve", "ollama", "0", "n", "llama3:latest"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert sim.stderr is not None
        lines = _Lines(sim.stderr)
        listening = lines.until(b"(port ")
        found = re.search(rb"\(port (\d+)\)", listening)
        assert found is not None
        url = f"http://127.0.0.1:{int(found.group(1))}/api/generate"
        assert _status(url) == 200
        for signum, said, status in [
            (signal.SIGUSR1, b"failing", 503),
            (signal.SIGUSR1, b"healthy", 200),
            (signal.SIGUSR2, b"gone", "ConnectionRefusedError"),
            (signal.SIGUSR2, b"back", 200),
        ]:
            sim.send_signal(signum)
            lines.until(said)
            assert _status(url) == status, said
    finally:
        sim.send_signal(signal.SIGTERM)
        assert sim.wait(timeout=20) == 0
