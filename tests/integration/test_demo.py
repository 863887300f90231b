"""`make demo`: the proxy standalone on etc/demo-fleet.toml; every facade streams an answer."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from nvpair.demo import FACADES, SIMULATED

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


def test_demo_streams_through_every_facade() -> None:
    ports = [*FACADES.values(), *(port for _, port, _, _ in SIMULATED)]
    if any(_busy(port) for port in ports):
        pytest.skip(f"the demo's fixed ports {ports} are not all free on this machine")
    demo = subprocess.Popen(
        [sys.executable, "-m", "nvpair.demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert demo.stdout is not None
        banner = ""
        deadline = time.monotonic() + 60
        while "Ctrl-C" not in banner and time.monotonic() < deadline:
            banner += demo.stdout.readline()
        assert "curl" in banner
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
    finally:
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=20) == 0
