"""What the real process keeps resident (docs/performance.md#memory)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor as _reactor
from twisted.internet import task
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.threads import deferToThread

from nvpair.sim import SimEngine
from tests.httpwire import read_stream
from tests.integration.conftest import enabled_proxy_for, running_proxy, sims
from tests.integration.harness import ProxyProcess, free_port, log_problems, write_fleet
from tests.integration.test_fleet import eventually, generates

#: The global reactor, untyped: its listenTCP generics reject a plain factory.
reactor: Any = _reactor


def node(node_id: str, url: str, *models: str) -> dict[str, object]:
    return {"id": node_id, "url": url, "models": list(models)}


def mapped_files(pid: int) -> set[str]:
    """The files process ``pid`` has mapped (shared libraries, extension modules)."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split(maxsplit=5)[5] for line in lines if len(line.split(maxsplit=5)) == 6}


@pytest.mark.parametrize("console_script", [False, True], ids=["twistd", "nvpair-proxy"])
@pytest_twisted.ensureDeferred
async def test_a_node_without_a_cluster_directory_never_loads_tls(
    tmp_path: Path, console_script: bool
) -> None:
    """Fleet mode without --cluster-dir serves without pyOpenSSL/cryptography in the process, and
    says nothing about it on stderr."""
    async with sims(("ollama", ["llama3:latest"], "a")) as (a,):
        port = free_port()
        fleet = write_fleet(tmp_path / "fleet.toml", port, {"a": a.url})
        args = ("--fleet", str(fleet))
        async with running_proxy(tmp_path, *args, console_script=console_script) as proxy:
            await eventually(lambda: generates(port, "hi"), proxy.logs)
            loaded = [f for f in mapped_files(proxy.pid) if "cryptography" in f or "OpenSSL" in f]
            problems = log_problems(proxy)
    assert loaded == []
    assert problems == []


# -- what a held request body costs (docs/robustness.md#what-a-request-body-costs) --------------

#: A body at the default --max-request-body: big enough that glibc maps each of its copies on
#: its own (above its largest mmap threshold, 32 MiB), so each shows in RSS and leaves with it.
BODY = 64 * 1024 * 1024
LLAMA_PATH = "/models/meta/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf"


def resident(pid: int) -> tuple[int, int]:
    """Process ``pid``'s resident set and its peak since the last :func:`reset_peak`, bytes."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in status)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def reset_peak(pid: int) -> None:
    """Start ``VmHWM`` again from the current resident set (proc(5), clear_refs)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def inference_body(model: str, size: int) -> bytes:
    """A completion naming ``model``, ``size`` bytes: lines of text in a member the simulated
    engine passes over (it would take seconds to count the words of 64 MiB of prompt, and
    miss its health probes meanwhile); to the proxy it is text like any prompt's."""
    head = b'{"model":%s,"stream":false,"prompt":"hi","notes":"' % json.dumps(model).encode()
    line = b"a line of text, as long as most lines are\\n"
    room = size - len(head) - 2
    return head + (line * (room // len(line) + 1))[:room].rstrip(b"\\") + b'"}'


def post(port: int, body: bytes, closed: threading.Event) -> bytes:
    """Write a whole request to the llama.cpp facade, then read its answer until the close or
    until ``closed`` is set."""
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(
            b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        client.sendall(body)
        client.settimeout(0.1)
        answer = b""
        while not closed.is_set():
            try:
                data = client.recv(65536)
            except TimeoutError:
                continue
            if not data:
                break
            answer += data
        return answer


async def until(check: Callable[[], bool], what: str) -> None:
    for _ in range(600):
        if check():
            return
        await task.deferLater(reactor, 0.1, lambda: None)
    raise AssertionError(f"never: {what}")


@asynccontextmanager
async def loading_engine(
    tmp_path: Path, *args: str
) -> AsyncIterator[tuple[SimEngine, ProxyProcess, int]]:
    """A llama.cpp sim that reads each request and then takes a minute to answer, as one
    loading a model, and the proxy in fleet mode in front of it: the sim, the proxy and the
    facade's port."""
    sim = SimEngine(reactor, "llamacpp", models=[LLAMA_PATH], node="a")
    sim.listen()
    port = free_port()
    fleet = write_fleet(tmp_path / "fleet.toml", port, {"a": sim.url}, engine="llamacpp")
    try:
        async with running_proxy(tmp_path, "--fleet", str(fleet), *args) as proxy:
            await proxy.wait_for_log(lambda r: "a joined llamacpp" in str(r.get("msg")))
            sim.faults.header_delay = 60.0
            yield sim, proxy, port
    finally:
        await sim.stop()


def posted(sim: SimEngine) -> int:
    return sum(r.method == "POST" for r in sim.requests)


async def held_cost(tmp_path: Path, model: str) -> tuple[float, float]:
    """What one BODY-byte request held by a loading engine costs the proxy: its resident set
    above the idle one, while held and at its peak, per body byte."""
    closed = threading.Event()
    async with loading_engine(tmp_path) as (sim, proxy, port):
        idle, _ = resident(proxy.pid)
        reset_peak(proxy.pid)
        client = deferToThread(post, port, inference_body(model, BODY), closed)
        try:
            await until(lambda: posted(sim) == 1, "the engine has the request")
            held, peak = resident(proxy.pid)
        finally:
            closed.set()
            await client
    return (held - idle) / BODY, (peak - idle) / BODY


@pytest.mark.parametrize(
    "model", [LLAMA_PATH, "Meta-Llama-3.1-8B-Instruct-Q4_K_M"], ids=["as-sent", "renamed"]
)
@pytest_twisted.ensureDeferred
async def test_a_held_body_costs_at_most_about_twice_its_bytes(tmp_path: Path, model: str) -> None:
    """Issue 29 item 5: a 64 MiB body made the proxy hold 3.4 to 3.8 times its size, 4.7 to 4.9 when
    its model was renamed (here, before: held 2.0 and 3.0 times, 4.0 and 5.0 at the peak). While
    the engine holds it, and at the peak of reading, admitting, renaming and sending it, about
    twice at most (docs/robustness.md#what-a-request-body-costs)."""
    held, peak = await held_cost(tmp_path, model)
    print(f"\n{model}: held {held:.2f}x, peak {peak:.2f}x of a {BODY >> 20} MiB body")
    assert held < 2.3 and peak < 2.5


@pytest_twisted.ensureDeferred
async def test_a_body_an_engine_does_not_read_is_not_copied_while_it_waits(
    tmp_path: Path,
) -> None:
    """An engine that accepts and reads nothing: what the kernel did not take was a copy of
    the body in the transport's buffer, beside the request as written and the body kept for
    the attempts (3 times). It waits where it is, a window at a time."""
    silent = Factory.forProtocol(Silent)
    listening = reactor.listenTCP(0, silent, interface="127.0.0.1")
    closed = threading.Event()
    try:
        engine = f"http://127.0.0.1:{listening.getHost().port}"
        async with running_proxy(tmp_path) as proxy:
            port = await enabled_proxy_for(proxy, "llamacpp", [node("a", engine, LLAMA_PATH)])
            idle, _ = resident(proxy.pid)
            reset_peak(proxy.pid)
            client = deferToThread(post, port, inference_body(LLAMA_PATH, BODY), closed)
            try:
                await until(lambda: Silent.connections == 1, "the engine has the connection")
                await task.deferLater(reactor, 1.0, lambda: None)
                held, peak = resident(proxy.pid)
            finally:
                closed.set()
                await client
    finally:
        await listening.stopListening()
    held, peak = (held - idle) / BODY, (peak - idle) / BODY  # type: ignore[assignment]
    print(f"\nan engine not reading: held {held:.2f}x, peak {peak:.2f}x of {BODY >> 20} MiB")
    assert held < 1.3 and peak < 2.5


class Silent(Protocol):
    """An engine's port that accepts and never reads."""

    connections = 0

    def connectionMade(self) -> None:
        Silent.connections += 1
        self.transport.pauseProducing()  # type: ignore[union-attr]


@pytest_twisted.ensureDeferred
async def test_max_body_memory_bounds_the_bodies_held_at_once(tmp_path: Path) -> None:
    """With room for two bodies, a third is 503 ``overloaded`` at its head (and its client,
    which wrote it all first, reads that answer); once the two are let go, two are let in
    again: nothing of theirs stays reserved. Bodies of 8 MiB: the engine here is a simulation
    in the test's own process, which must keep answering its health probes."""
    size = BODY // 8
    closed = threading.Event()
    async with loading_engine(tmp_path, "--max-body-memory", str(2 * size)) as (sim, _, port):
        clients = [
            deferToThread(post, port, inference_body(LLAMA_PATH, size), closed) for _ in (1, 2)
        ]
        try:
            await until(lambda: posted(sim) == 2, "the engine has both")
            third = await deferToThread(
                post, port, inference_body(LLAMA_PATH, size), threading.Event()
            )
        finally:
            closed.set()
            for client in clients:
                await client
        (answer,) = read_stream(third, [b"POST"], closed=True)
        assert (answer.status, answer.value(b"x-nvpair-error")) == (503, b"overloaded")
        assert answer.value(b"retry-after") == b"5"
        # The proxy let the two go (and stopped their attempts) once their clients left.
        await until(lambda: sim.in_flight == 0, "the engine is asked for nothing")
        later = threading.Event()
        again = [deferToThread(post, port, inference_body(LLAMA_PATH, size), later) for _ in (1, 2)]
        try:
            await until(lambda: posted(sim) == 4, "the engine has two bodies again")
        finally:
            later.set()
            for client in again:
                await client
