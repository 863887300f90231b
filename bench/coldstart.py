"""The cold-start mix: the same seeded workload through nvpair in fleet mode (warm-aware order)
and in broker mode with no scheduler (the default order), each in front of four fresh
simulated Ollama nodes that start with no model in memory and hold at most two models at once.

- **warm-aware** — ``twistd -n nvpair-proxy --fleet FILE``: the proxy polls every node's
  ``/api/tags`` and ``/api/ps`` and puts a node holding the model in memory first
  (docs/fleet-scheduling.md);
- **default** — the same proxy in broker mode, this process its broker (:mod:`bench.broker`):
  the Ollama facade enabled, one discovery snapshot listing the four nodes and their models,
  and never a ``node/set-priority``, so every node counts as listed with ``pending`` 0 and the
  least-reserved owner goes first, ties by node id (docs/candidate-order.md).

The client (asyncio, no Twisted: it must not share a design with what it measures) sends each
request at its arrival time on a connection of its own and records the time from starting to
connect to the first body byte. The cold starts are the nodes' own count of the loads they
started (``bench.simnode``'s control port).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

import attrs

from bench.broker import Broker, snapshot
from bench.contenders import Cold, Node, node
from bench.held import WireError, read_body, read_head
from bench.mixload import (
    KEEP_ALIVE,
    LOAD_DELAY,
    MAX_LOADED,
    NODES,
    Mix,
    Outcome,
    Request,
    models_of,
)
from bench.procs import TWISTD, free_port, process, wait_for, wait_until

SIDES = ("default", "warm-aware")
ENGINE = "ollama"
#: Seconds one request may take, loads and the longest answer included, before it is a failure.
REQUEST_TIMEOUT = 120.0


@contextmanager
def fleet(mix: Mix, room: int = MAX_LOADED) -> Iterator[dict[str, Node]]:
    """Four fresh simulated Ollama nodes, cold, each holding its models of the placement and
    room in memory for ``room`` of them (:data:`~bench.mixload.MAX_LOADED` by default)."""
    high = mix.tokens[1]
    with ExitStack() as stack:
        nodes = {
            name: stack.enter_context(
                node(
                    tokens=high,
                    interval=mix.token_seconds,
                    cold=Cold(models_of(name), LOAD_DELAY, KEEP_ALIVE, room),
                )
            )
            for name in NODES
        }
        yield nodes


@attrs.frozen
class Proxy:
    """A proxy serving the Ollama facade on ``port``; ``detail`` says how it was set up."""

    port: int
    pid: int
    detail: str


def _argv(work: Path, *extra: str) -> list[str]:
    state = ["--state-dir", str(work / "state"), "--log-level", "warn"]
    return [TWISTD, "--pidfile=", "-n", "nvpair-proxy", *extra, *state]


@contextmanager
def warm_aware(nodes: Mapping[str, Node], work: Path) -> Iterator[Proxy]:
    """Standalone fleet mode, the fleet file's defaults (``inventory-interval`` 5 s)."""
    port = free_port()
    config = work / "fleet.toml"
    config.write_text(
        f"[facades.{ENGINE}]\nport = {port}\n"
        + "".join(
            f'[[nodes]]\nid = "{name}"\n[nodes.engines]\n{ENGINE} = "{n.url}"\n'
            for name, n in nodes.items()
        )
    )
    polled = {name: n.counts()[1] for name, n in nodes.items()}
    with (
        open(work / "proxy.log", "wb") as log,
        process(
            _argv(work, "--fleet", str(config)), cwd=work, stdin=subprocess.DEVNULL, stderr=log
        ) as child,
    ):
        wait_for(port)
        # Every node's model list and load state polled once (two requests each), so all four
        # are in discovery when the first request arrives, as in the default order's snapshot.
        wait_until(
            lambda: all(n.counts()[1] >= polled[name] + 2 for name, n in nodes.items()),
            30,
            "the first polls of every node",
        )
        time.sleep(0.5)
        yield Proxy(port, child.pid, "fleet mode, inventory-interval 5 s")


@contextmanager
def default_order(nodes: Mapping[str, Node], work: Path) -> Iterator[Proxy]:
    """Broker mode, this process the broker; no scheduler snapshot is ever sent."""
    port = free_port()
    with (
        open(work / "proxy.log", "wb") as log,
        process(
            _argv(work), cwd=work, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log
        ) as child,
    ):
        broker = Broker(child)
        try:
            broker.enable(ENGINE, port)
            urls = {name: n.url for name, n in nodes.items()}
            inventories = {name: models_of(name) for name in nodes}
            broker.notify(f"{ENGINE}:discovery:nodes", snapshot(urls, inventories))
            broker.barrier()
            wait_for(port)
            yield Proxy(port, child.pid, "broker mode, one discovery snapshot, no priority")
        finally:
            # EOF: the proxy stops on its own; the process block then finds it gone (or ends it).
            with suppress(OSError):
                broker.close()
            with suppress(subprocess.TimeoutExpired):
                child.wait(timeout=10)
                broker.drained()


SIDE_PROXIES = {"default": default_order, "warm-aware": warm_aware}


# -- the client -----------------------------------------------------------------------------------


def request_bytes(port: int, request: Request) -> bytes:
    body = request.body()
    head = [
        f"POST {request.path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Connection: close",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def send(port: int, request: Request, timeout: float = REQUEST_TIMEOUT) -> Outcome:
    """Send one request and read its answer to the end."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    status: int | None = None
    first: float | None = None
    served = ""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(request_bytes(port, request))
                status, headers = await read_head(reader)
                served = headers.get(b"x-nvpair-node", b"").decode("latin-1")
                async for payload in read_body(reader, headers):
                    if payload and first is None:
                        first = loop.time()
            finally:
                writer.close()
    except (TimeoutError, OSError, ValueError, WireError, asyncio.IncompleteReadError) as error:
        reason = f"{type(error).__name__}: {error}"[:120]
        return Outcome(request.stream, status, None, served, reason)
    ms = (first - started) * 1000 if first is not None else None
    return Outcome(request.stream, status, ms, served, "" if status == 200 else f"status {status}")


async def _play(port: int, requests: Sequence[Request]) -> list[Outcome]:
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks: list[asyncio.Task[Outcome]] = []
    for request in requests:
        delay = start + request.at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(port, request)))
    return list(await asyncio.gather(*tasks))


def play(port: int, requests: Sequence[Request]) -> list[Outcome]:
    """Every request at its arrival time (each on its own connection), all answers read."""
    return asyncio.run(_play(port, requests))


@attrs.frozen
class SideRun:
    """One side of a round: what the client saw, and the cold starts (and the evictions among
    them) each node counted."""

    outcomes: list[Outcome]
    loads: dict[str, int]
    detail: str
    seconds: float
    evictions: dict[str, int] = attrs.field(factory=dict)


def run_side(
    side: str, requests: Sequence[Request], mix: Mix, work: Path, room: int = MAX_LOADED
) -> SideRun:
    """Fresh nodes, a fresh proxy for ``side``, the workload played through it."""
    with fleet(mix, room) as nodes, SIDE_PROXIES[side](nodes, work) as proxy:
        started = time.monotonic()
        outcomes = play(proxy.port, requests)
        elapsed = time.monotonic() - started
        loads = {name: n.loads() for name, n in nodes.items()}
        evictions = {name: n.evictions() for name, n in nodes.items()}
    return SideRun(outcomes, loads, proxy.detail, elapsed, evictions)
