"""Real ``llama-server`` processes on loopback, serving the tiny random GGUF as ``tiny``.

Shared by the tests in ``tests/real``: where the binary is (``make test-real`` builds it, or
``NVPAIR_LLAMA_SERVER`` names one), and how one is started and waited for until it serves.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import free_port

ROOT = Path(__file__).resolve().parents[2]
BUILT = ROOT / ".cache" / "llama.cpp" / "build" / "bin" / "llama-server"


def llama_server_binary() -> Path:
    """The ``llama-server`` to run; skips the calling test or fixture when there is none."""
    binary = Path(os.environ.get("NVPAIR_LLAMA_SERVER", BUILT))
    if not binary.exists():
        pytest.skip(f"no llama-server at {binary}: `make test-real` builds one")
    return binary


@contextlib.contextmanager
def running_llama_server(
    binary: Path, model: Path, *extra: str, slots: int = 2, ready_within: float = 60
) -> Iterator[str]:
    """A ``llama-server`` for ``model`` (alias ``tiny``) on a free loopback port, for the body
    of a ``with``; yields its base URL once ``/health`` answers 200, terminates it afterwards.

    :param extra: more command-line arguments.
    :param slots: ``-np``, how many requests it runs at once.
    """
    port = free_port()
    server = subprocess.Popen(
        [
            str(binary),
            "-m",
            str(model),
            "--alias",
            "tiny",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-c",
            "256",
            "-np",
            str(slots),
            "--seed",
            "7",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_within
        while time.monotonic() < deadline:
            if server.poll() is not None:
                pytest.fail(f"llama-server exited with {server.returncode} before serving")
            try:
                with urllib.request.urlopen(url + "/health", timeout=1):
                    break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail(f"llama-server did not become healthy in {ready_within:g} s")
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
