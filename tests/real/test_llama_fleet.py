"""Fleet mode's warm-aware order against two real ``llama-server`` processes (issue 13 item 7;
docs/fleet-scheduling.md#order).

The simulated ``/slots`` (``nvpair/sim``) is checked against the real engine: what llama-server
answers on ``/health`` and ``/slots`` reads as the load the order uses, and through
``twistd -n nvpair-proxy --fleet`` a server whose every slot generates for another client is
passed over for an idle one, which a lower node id alone would not do.

A slot is kept busy by a streaming ``/completion`` sent straight to the server (never through
the proxy, so nothing but ``/slots`` can tell the proxy about it) that generates until its
connection is closed: ``n_predict`` -1, ``ignore_eos`` (random weights sample the end token
often) and ``--context-shift`` (the tiny model's context is full after a few hundred tokens).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import pytest
import pytest_twisted
import treq

from nvpair.engines.loadstate import LLAMACPP_PROBE, Answer, LoadState
from nvpair.fleet.loadpoll import read_load
from tests.integration.harness import ProxyProcess, log_problems
from tests.real.servers import fleet_proxy as servers_fleet_proxy
from tests.real.servers import llama_server_binary, post_chat, running_llama_server, sleep
from tests.real.tiny_gguf import write_tiny_gguf

#: The fleet file's ``inventory-interval``.
POLL = 0.1

#: How long to give the proxy after a server's ``/slots`` changed: enough polls that one of
#: them asked after the change and its answer has been read.
SETTLE = 1.0


class Servers(NamedTuple):
    """Server A (two slots) would win on node id alone; B (one slot) is the other choice."""

    a: str
    b: str


A_SLOTS = 2


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    binary = llama_server_binary()
    model = write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")
    with (
        running_llama_server(binary, model, "--context-shift", slots=A_SLOTS) as a,
        running_llama_server(binary, model, slots=1) as b,
    ):
        yield Servers(a, b)


class Generation:
    """A streaming ``/completion`` sent straight to a llama-server, in a thread of its own,
    that keeps one slot generating until :meth:`stop` closes its connection.

    :ivar chunks: how many stream events it has read.
    :ivar error: what went wrong in the thread, if anything did (the stream ending by itself
        included: the slot would then be idle again).
    """

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        assert parts.hostname is not None
        self._connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.chunks = 0
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the generation thread did not stop"

    def _run(self) -> None:
        body = {
            "prompt": "hello there",
            "n_predict": -1,
            "ignore_eos": True,
            "stream": True,
            "cache_prompt": False,
        }
        try:
            self._connection.request(
                "POST",
                "/completion",
                json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )
            response = self._connection.getresponse()
            if response.status != 200:
                raise AssertionError(f"/completion answered {response.status}")
            while not self._stop.is_set():
                line = response.readline()
                if not line:
                    raise AssertionError(f"the generation ended by itself after {self.chunks}")
                if line.startswith(b"data: "):
                    self.chunks += 1
        except BaseException as error:
            self.error = error
        finally:
            # Closing is what ends the generation: llama-server cancels a stream whose client
            # has gone.
            self._connection.close()


@contextlib.contextmanager
def generating(url: str, count: int) -> Iterator[list[Generation]]:
    """``count`` :class:`Generation` s on ``url`` for the body of a ``with``, stopped after."""
    generations = [Generation(url) for _ in range(count)]
    try:
        for generation in generations:
            generation.start()
        yield generations
    finally:
        for generation in generations:
            generation.stop()


async def slots(url: str) -> list[dict[str, Any]]:
    """The server's own ``GET /slots``."""
    response = await treq.get(url + "/slots", timeout=10)
    document = json.loads(await response.content())
    assert response.code == 200 and isinstance(document, list), document
    return document


async def until_busy(url: str, busy: int, timeout: float = 20) -> list[dict[str, Any]]:
    """Poll the server's ``/slots`` until exactly ``busy`` slots are processing."""
    deadline = time.monotonic() + timeout
    while True:
        document = await slots(url)
        if sum(bool(slot.get("is_processing")) for slot in document) == busy:
            return document
        if time.monotonic() > deadline:
            raise AssertionError(f"never {busy} slots busy: {document}")
        await sleep(0.05)


async def load_state(url: str) -> LoadState:
    """What :mod:`nvpair.engines.loadstate` reads from the server's real ``/health``,
    ``/props`` and model list, then its ``/slots``, asked as a poll asks them."""

    async def ask(path: str) -> Answer:
        response = await treq.get(url + path, timeout=10)
        return Answer(int(response.code), await response.content())

    return await read_load(LLAMACPP_PROBE, lambda name: name, ask)


async def answered_by(port: int) -> str | None:
    """A chat completion for ``tiny`` through the proxy; the ``X-Nvpair-Node`` that answered."""
    began = time.monotonic()
    response, body = await post_chat(port)
    node = response.headers.getRawHeaders(b"x-nvpair-node")
    assert response.code == 200, (response.code, node, body[:300])
    # Answered at once: not queued behind a busy slot until a header timeout sent it elsewhere.
    assert time.monotonic() - began < 4
    return node[0].decode() if node else None


@contextlib.asynccontextmanager
async def fleet_proxy(tmp_path: Path, pair: Servers) -> AsyncIterator[tuple[ProxyProcess, int]]:
    """The proxy in standalone fleet mode over both servers as ``a-node`` and ``b-node``,
    once both have joined and been polled a few times; yields it and its llama.cpp port."""
    # One attempt and a short header timeout: a request sent to the busy server fails as
    # that, instead of waiting there or being retried on the other server.
    args = ("--max-dispatch-attempts", "1", "--response-header-timeout", "5s")
    async with servers_fleet_proxy(
        tmp_path,
        {"a-node": pair.a, "b-node": pair.b},
        *args,
        interval=f"{int(POLL * 1000)}ms",
        settle=SETTLE,
    ) as running:
        yield running


@pytest_twisted.ensureDeferred
async def test_real_health_and_slots_read_as_warm_with_busy_slots(servers: Servers) -> None:
    """The load-state parser (``/health`` 200, ``/slots`` with ``is_processing``) reads what a
    real llama-server answers: its model in memory, its slot count, and the busy ones among
    them, counted as they start and end."""
    await until_busy(servers.a, 0)
    assert await load_state(servers.a) == LoadState(warm_all=True, slots=A_SLOTS, busy=0)
    with generating(servers.a, 1) as held:
        await until_busy(servers.a, 1)
        assert await load_state(servers.a) == LoadState(warm_all=True, slots=A_SLOTS, busy=1)
    assert [g.error for g in held] == [None]
    await until_busy(servers.a, 0)
    assert await load_state(servers.a) == LoadState(warm_all=True, slots=A_SLOTS, busy=0)


@pytest_twisted.ensureDeferred
async def test_a_busy_server_is_passed_over_for_an_idle_one(
    tmp_path: Path, servers: Servers
) -> None:
    """docs/fleet-scheduling.md#order: both idle, ``a-node`` wins the tie by id; with every
    slot of A generating for a client the proxy never saw (only A's ``/slots`` says so), the
    request goes to ``b-node``; once A is idle again, back to ``a-node``."""
    await until_busy(servers.a, 0)
    async with fleet_proxy(tmp_path, servers) as (proxy, port):
        assert await answered_by(port) == "a-node"
        with generating(servers.a, A_SLOTS) as held:
            await until_busy(servers.a, A_SLOTS)
            await sleep(SETTLE)
            for _ in range(3):
                assert await answered_by(port) == "b-node"
            # A was busy all along: the generations still run.
            assert len(await until_busy(servers.a, A_SLOTS, timeout=0)) == A_SLOTS
            assert all(g.error is None and g.chunks > 0 for g in held)
        assert [g.error for g in held] == [None] * A_SLOTS
        await until_busy(servers.a, 0)
        await sleep(SETTLE)
        assert await answered_by(port) == "a-node"
        assert log_problems(proxy) == []
