"""Real ``llama-server`` processes on loopback, serving the tiny random GGUF.

Shared by the tests in ``tests/real``: where the binary is, and how one is started and waited
for until it serves.

The binary is ``NVPAIR_LLAMA_SERVER`` when set, else the per-machine cache that
``tests/real/llama_build.py`` fills (``make test`` and ``make test-real`` build it first). Without
one a test skips, saying how to build it — unless ``NVPAIR_REQUIRE_LLAMA_SERVER=1`` (which the
Makefile exports): then a missing binary is a failure, so ``make test`` can never pass by
skipping the real engine.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import treq
from twisted.internet import reactor, task
from twisted.web.http_headers import Headers

from tests.integration.conftest import running_proxy
from tests.integration.harness import ProxyProcess, free_port
from tests.real.llama_build import OVERRIDE, installed_binary

#: Set to ``1`` (the Makefile does) to fail, not skip, when there is no binary.
REQUIRE = "NVPAIR_REQUIRE_LLAMA_SERVER"


def find_llama_server(environ: Mapping[str, str] = os.environ) -> Path:
    """Where the ``llama-server`` to run should be (it may not exist)."""
    override = environ.get(OVERRIDE)
    return Path(override) if override else installed_binary(environ)


def llama_server_binary(environ: Mapping[str, str] = os.environ) -> Path:
    """The ``llama-server`` to run; skips the calling test or fixture when there is none, or
    fails it when ``NVPAIR_REQUIRE_LLAMA_SERVER=1``."""
    binary = find_llama_server(environ)
    if not binary.exists():
        message = (
            f"no llama-server at {binary}: `make test` or `make test-real` builds one "
            f"(python -m tests.real.llama_build), or set {OVERRIDE}"
        )
        if environ.get(REQUIRE) == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return binary


class LlamaServer(NamedTuple):
    """A running server: its base URL, its port, its process and the model alias it serves."""

    url: str
    port: int
    process: subprocess.Popen[bytes]
    alias: str


@contextlib.contextmanager
def llama_server_process(
    binary: Path,
    model: Path | None,
    *extra: str,
    alias: str | None = "tiny",
    slots: int = 2,
    ready_within: float = 60,
) -> Iterator[LlamaServer]:
    """A ``llama-server`` for ``model`` on a free loopback port, for the body of a ``with``;
    yields it once ``/health`` answers 200, terminates it afterwards (or kills it, when it does
    not stop: a test may have left it stopped with ``SIGSTOP``).

    :param model: None for a router (its models named in ``extra``: ``--models-dir``).

    :param extra: more command-line arguments.
    :param alias: ``--alias``, the model id it lists and answers to; None: none, so the id
        is the model's path as given to ``-m``.
    :param slots: ``-np``, how many requests it runs at once.
    """
    port = free_port()
    server = subprocess.Popen(
        [
            str(binary),
            *(["-m", str(model)] if model is not None else []),
            *(["--alias", alias] if model is not None and alias is not None else []),
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
    alias = str(model) if alias is None else alias  # the id a server without --alias lists
    try:
        deadline = time.monotonic() + ready_within
        while time.monotonic() < deadline:
            if server.poll() is not None:
                pytest.fail(f"llama-server exited with {server.returncode} before serving")
            try:
                with urllib.request.urlopen(url + "/health", timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail(f"llama-server did not become healthy in {ready_within:g} s")
        yield LlamaServer(url, port, server, alias)
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGCONT)
            server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


@contextlib.contextmanager
def running_llama_server(
    binary: Path, model: Path, *extra: str, alias: str = "tiny", slots: int = 2
) -> Iterator[str]:
    """:func:`llama_server_process`, yielding only the base URL."""
    with llama_server_process(binary, model, *extra, alias=alias, slots=slots) as server:
        yield server.url


#: Numbers each chat of :func:`post_chat` its own.
CHATS = itertools.count()


async def post_chat(port: int, model: str = "tiny", timeout: float = 30) -> tuple[Any, bytes]:
    """A short non-streaming chat completion for ``model`` through the proxy on ``port``;
    the response and its body. Each is a new conversation, so that the fleet order places
    it, not affinity (docs/fleet-scheduling.md#affinity-order)."""
    message = {"role": "user", "content": f"hi {next(CHATS)}"}
    response = await treq.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json.dumps({"model": model, "messages": [message], "max_tokens": 4}).encode(),
        headers=Headers({b"Content-Type": [b"application/json"]}),
        timeout=timeout,
    )
    return response, await response.content()


async def sleep(seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


@contextlib.asynccontextmanager
async def fleet_proxy(
    tmp_path: Path,
    nodes: Mapping[str, str],
    *args: str,
    interval: str = "100ms",
    settle: float = 1.0,
    credentials: Mapping[str, str] | None = None,
    env: dict[str, str] | None = None,
    extra: str = "",
) -> AsyncIterator[tuple[ProxyProcess, int]]:
    """``twistd -n nvpair-proxy --fleet`` with the llama.cpp facade on a free port over
    ``nodes`` (node id to llama-server URL), once every node has joined discovery and
    ``settle`` seconds more have let its load state be read; yields the proxy and its port.

    :param args: more proxy options.
    :param interval: the fleet file's ``inventory-interval``.
    :param credentials: node id to its ``[nodes.credentials]`` value (``env:NAME``).
    :param env: the proxy's environment, besides the test's own.
    :param extra: more of the fleet file, after the nodes (``[access]``, ``[models]``).
    """
    port = free_port()
    fleet = tmp_path / "fleet.toml"
    lines = [f'inventory-interval = "{interval}"', "[facades.llamacpp]", f"port = {port}"]
    for node, url in nodes.items():
        lines += ["[[nodes]]", f'id = "{node}"', "[nodes.engines]", f'llamacpp = "{url}"']
        if credentials and node in credentials:
            lines += ["[nodes.credentials]", f'llamacpp = "{credentials[node]}"']
    fleet.write_text("\n".join(lines) + "\n" + extra)
    async with running_proxy(tmp_path, "--fleet", str(fleet), *args, env=env) as proxy:
        for node in nodes:

            def joined(record: dict[str, Any], node: str = node) -> bool:
                return f"{node} joined llamacpp discovery" in str(record.get("msg"))

            await proxy.wait_for_log(joined, timeout=20)
        await sleep(settle)
        yield proxy, port
