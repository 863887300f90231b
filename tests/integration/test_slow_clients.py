"""Slow and idle clients never keep a normal client from being served
(docs/request-path.md#the-facade: ``--request-head-timeout`` and ``--idle-timeout``; the
listener's sniff timeout).

The real ``twistd -n nvpair-proxy`` in broker mode, one simulated llama.cpp node, a head timeout
of 2 s and an idle timeout of 3 s. 2,001 connections to the facade port, a third each:

- silent: never send a byte; the listener closes them after ``SNIFF_TIMEOUT`` (10 s);
- trickling: a request head one byte every 0.5 s, never completed; closed after the head
  timeout (the idle timeout, which every byte resets, would never catch them);
- idle: one whole request on a kept-alive connection, answered, then nothing; closed after the
  idle timeout.

While every one of them is open, a normal client's streaming and whole requests are answered in
full. Then each kind is closed by the proxy on its own schedule, its descriptors come back, and
nothing is left in flight or reserved.

The connections are opened at most ``WINDOW`` ahead of the proxy's accept() (its open
descriptors count what it accepted), so the facade's listen backlog (Twisted's default, 50)
never overflows. Opened all at once, 2,000 connects overflowed it about 2,400 times: some 1,300
connects waited for a SYN retransmit (over a second), and with SYN cookies about 1,000
"connected" clients were never accepted at all; a silent one of those is invisible to the proxy,
so no timeout of the proxy's could close it.
"""

from __future__ import annotations

import enum
import json
import os
import resource
import statistics
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import defer, reactor, task
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import HTTPConnectionPool
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from nvpair.sim import SimEngine
from nvpair.wire.trust.sniffing import SNIFF_TIMEOUT
from tests.httpwire import Malformed, WireResponse, read_stream
from tests.integration.conftest import enabled_proxy_for, sims
from tests.integration.harness import (
    ProxyProcess,
    fd_limits,
    free_port,
    log_problems,
    open_fds,
    soft_fd_limit,
    start_proxy,
    stderr_mark,
    terminal_problems,
    workload_events,
)

pytestmark = pytest.mark.integration

HEAD_TIMEOUT = 2.0
IDLE_TIMEOUT = 3.0
ARGS = ("--request-head-timeout", f"{HEAD_TIMEOUT:g}s", "--idle-timeout", f"{IDLE_TIMEOUT:g}s")

#: Flood connections wanted, three equal thirds (scaled down, with a warning, when the hard
#: limit is too low).
FLOOD = 2001
#: Descriptors kept free besides the flood, in this process and in the proxy.
FD_MARGIN = 512
#: Connections opened but not yet accepted, at most: below Twisted's listen backlog of 50.
WINDOW = 32
#: Kept-alive requests sent but not yet answered, at most (the sim runs in this process).
REQUESTS_AHEAD = 32
TRICKLE_EVERY = 0.5
#: Every byte a trickling client will ever send; at one per TRICKLE_EVERY it never completes
#: within the head timeout.
TRICKLED_HEAD = b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}"
#: Timers here and in the proxy read the same wall clock; allow for its rounding. Every
#: lower bound is measured from something this side *started* (the dial, the first write),
#: which precedes the proxy's timer; what this side *noticed* (a connect, an answer) may lag
#: behind the proxy by a busy reactor turn.
EARLY = 0.01
#: How long past its timeout a kind may take to be closed, on 2 busy cores.
LATE = 4.0

MODEL = "tiny"
PROMPT = "one two three"


class Kind(enum.Enum):
    SILENT = "silent"
    TRICKLE = "trickle"
    IDLE = "idle"


def _whole_answer(data: bytes) -> bool:
    try:
        return len(read_stream(data, [b"POST"], closed=False)) >= 1
    except Malformed:
        return False


class FloodClient(Protocol):
    """One flood connection; keeps what it was sent and when things happened.

    :ivar dialled_at: when the connection was asked for (before the proxy accepted it).
    :ivar connected_at: when this side saw the connection made.
    :ivar started_at: when the first trickled byte, or the whole request, was written (before
        the proxy read it).
    :ivar answered_at: when the whole answer to the request had arrived (``IDLE`` only).
    :ivar reset: the proxy's close was an abort (RST) rather than an orderly FIN.
    """

    def __init__(self, kind: Kind, port: int) -> None:
        self.kind = kind
        self.port = port
        self.received = b""
        self.sent = 0
        self.dialled_at: float | None = None
        self.connected_at: float | None = None
        self.started_at: float | None = None
        self.answered_at: float | None = None
        self.closed_at: float | None = None
        self.reset: bool | None = None

    @property
    def open(self) -> bool:
        return self.connected_at is not None and self.closed_at is None

    def connectionMade(self) -> None:
        self.connected_at = reactor.seconds()

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        if self.kind is Kind.IDLE and self.answered_at is None and _whole_answer(self.received):
            self.answered_at = reactor.seconds()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.closed_at = reactor.seconds()
        self.reset = reason.check(ConnectionDone) is None

    def request(self) -> None:
        """Send one whole inference request; HTTP/1.1 keeps the connection alive after it."""
        body = json.dumps({"model": MODEL, "prompt": PROMPT, "stream": False}).encode()
        head = (
            f"POST /completion HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        self._write(head + body)

    def trickle(self) -> None:
        """Send the next byte of a head that is never finished."""
        if self.open and self.sent < len(TRICKLED_HEAD):
            self._write(TRICKLED_HEAD[self.sent : self.sent + 1])

    def _write(self, data: bytes) -> None:
        assert self.transport is not None
        if self.started_at is None:
            self.started_at = reactor.seconds()
        self.sent += len(data)
        self.transport.write(data)

    def abort(self) -> None:
        if self.open and self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    def answer(self) -> WireResponse:
        """The one answer a kept-alive client got (nothing else came on its connection)."""
        (response,) = read_stream(self.received, [b"POST"], closed=True)
        return response


# -- small helpers --------------------------------------------------------------------------------


async def sleep(seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


async def poll(check: Callable[[], bool], timeout: float, every: float = 0.05) -> bool:
    """Whether ``check`` held within ``timeout`` seconds (a bounded wait; the caller asserts)."""
    deadline = reactor.seconds() + timeout
    while not check():
        if reactor.seconds() >= deadline:
            return False
        await sleep(every)
    return True


async def settled_fds(pid: int) -> int:
    """``pid``'s descriptor count once it is the same twice, 100 ms apart."""
    previous = -1
    for _ in range(50):
        await sleep(0.1)
        count = open_fds(pid)
        if count == previous:
            break
        previous = count
    return previous


def all_closed(group: Sequence[FloodClient]) -> Callable[[], bool]:
    return lambda: not any(client.open for client in group)


def spread(values: Sequence[float]) -> str:
    return f"min {min(values):.2f} median {statistics.median(values):.2f} max {max(values):.2f}"


# -- the normal client ----------------------------------------------------------------------------

# Not persistent: the normal client leaves no connection open on the proxy, so its descriptors
# can be compared with the baseline at the end.
_POOL = HTTPConnectionPool(reactor, persistent=False)


async def normal(port: int, stream: bool) -> tuple[IResponse, bytes, float]:
    """A normal client's request to ``/completion``: the response, its whole body, and the
    seconds it took."""
    began = reactor.seconds()
    response = await treq.post(
        f"http://127.0.0.1:{port}/completion",
        json.dumps({"model": MODEL, "prompt": PROMPT, "stream": stream}).encode(),
        headers=Headers({b"content-type": [b"application/json"]}),
        pool=_POOL,
        timeout=30,
    )
    body: bytes = await treq.content(response)
    return response, body, reactor.seconds() - began


def expect_served(sim: SimEngine, response: IResponse, body: bytes, stream: bool) -> None:
    """The node's whole answer, relayed as it was sent."""
    assert response.code == 200, (response.code, body)
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [sim.node.encode()]
    assert not response.headers.hasHeader(b"x-nvpair-error")
    text = "".join(sim.tokens)
    if not stream:
        answer = json.loads(body)
        assert (answer["content"], answer["stop"]) == (text, True), answer
        return
    # llama.cpp's native stream: one SSE event per token, then the stop event (no [DONE]).
    assert body.endswith(b"\n\n"), body
    events = [json.loads(event.removeprefix(b"data: ")) for event in body[:-2].split(b"\n\n")]
    *tokens, final = events
    assert "".join(event["content"] for event in tokens) == text, events
    assert not any(event["stop"] for event in tokens) and final["stop"] is True, events


async def admin_status(admin_port: int) -> dict[str, Any]:
    response = await treq.get(f"http://127.0.0.1:{admin_port}/status", pool=_POOL, timeout=10)
    assert response.code == 200
    status: dict[str, Any] = json.loads(await treq.content(response))
    return status


# -- the test -------------------------------------------------------------------------------------


def flood_size() -> int:
    """How many flood connections this machine's hard open-files limit allows (up to FLOOD),
    in both this process and the proxy (which inherits the hard limit)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        return FLOOD
    room = hard - open_fds(os.getpid()) - FD_MARGIN
    size = min(FLOOD, room)
    if size < 300:
        pytest.skip(f"hard open-files limit {hard} leaves room for {room} connections only")
    if size < FLOOD:
        warnings.warn(
            f"hard open-files limit {hard}: flooding with {size} connections, not {FLOOD}",
            stacklevel=1,
        )
    return size


@pytest_twisted.ensureDeferred
async def test_slow_and_idle_clients_never_keep_a_normal_client_waiting(tmp_path: Path) -> None:
    size = flood_size()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Spawned with a low soft limit, so the proxy has to raise its own.
    spawn_soft = max(1024, open_fds(os.getpid()) + 256)
    admin_port = free_port()
    with soft_fd_limit(spawn_soft):
        proxy = start_proxy(tmp_path, *ARGS, "--admin-port", str(admin_port))
    try:
        async with sims(("llamacpp", [MODEL], "node-a")) as (sim,):
            nodes = [{"id": sim.node, "url": sim.url, "models": [MODEL]}]
            port = await enabled_proxy_for(proxy, "llamacpp", nodes)
            # Room for the flood in this process too (the sim's side of the proxy's upstream
            # connections lives here as well).
            with soft_fd_limit(max(soft, open_fds(os.getpid()) + size + FD_MARGIN)):
                await _flood(proxy, sim, port, admin_port, size, spawn_soft, hard)
    finally:
        await proxy.terminate()


async def _flood(
    proxy: ProxyProcess,
    sim: SimEngine,
    port: int,
    admin_port: int,
    size: int,
    spawn_soft: int,
    hard: int,
) -> None:
    pid = proxy.pid
    numbers: dict[str, object] = {"connections": size}

    # 1. The proxy raised its soft open-files limit to the hard one.
    proxy_soft, proxy_hard = fd_limits(pid)
    assert proxy_soft == proxy_hard, (proxy_soft, proxy_hard)
    if hard != resource.RLIM_INFINITY and spawn_soft < hard:
        assert proxy_soft == hard, (proxy_soft, hard)
    numbers["proxy limits"] = (spawn_soft, proxy_soft, proxy_hard)

    # Warm up (also the normal client's latency unflooded), then the descriptor baseline with
    # no pooled connection to the sim left.
    calm = []
    for stream in (True, False):
        response, body, seconds = await normal(port, stream)
        expect_served(sim, response, body, stream)
        calm.append(seconds)
    numbers["calm latency"] = calm
    sim.drop_connections()
    baseline = await settled_fds(pid)
    numbers["baseline fds"] = baseline
    stderr_from = stderr_mark(proxy)
    frames_from = len(proxy.frames)

    kinds = [Kind.SILENT, Kind.TRICKLE, Kind.IDLE]
    clients = [FloodClient(kinds[i % 3], port) for i in range(size)]
    by_kind = {kind: [c for c in clients if c.kind is kind] for kind in Kind}
    try:
        # 2. Open every connection, silent for now, never more than WINDOW ahead of accept().
        began = reactor.seconds()
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=30)
        failures: list[Failure] = []
        opened = 0
        while opened < size:
            accepted = open_fds(pid) - baseline
            for client in clients[opened : min(size, accepted + WINDOW)]:
                client.dialled_at = reactor.seconds()
                connectProtocol(endpoint, client).addErrback(failures.append)
                opened += 1
            await sleep(0.002)
        assert await poll(lambda: all(c.open for c in clients) or bool(failures), 30)
        assert failures == [], failures[:3]
        assert await poll(lambda: open_fds(pid) - baseline >= size, 10)
        numbers["opened in"] = reactor.seconds() - began
        numbers["fds flooded"] = open_fds(pid)

        # The kept-alive third: one whole request each, a bounded number at a time.
        began = reactor.seconds()
        idle = by_kind[Kind.IDLE]
        for sent, client in enumerate(idle):
            while sent - sum(c.answered_at is not None for c in idle) >= REQUESTS_AHEAD:
                await sleep(0.002)
            client.request()
        assert await poll(lambda: all(c.answered_at is not None for c in idle), 60)
        numbers["kept-alive requests answered in"] = reactor.seconds() - began

        # The trickling third starts; from here a head is never completed.
        trickling = by_kind[Kind.TRICKLE]

        def tick() -> None:
            for client in trickling:
                client.trickle()

        tick()
        ticker = task.LoopingCall(tick)
        ticker.clock = reactor
        ticker.start(TRICKLE_EVERY, now=False)
        try:
            # 3. A normal client, while every flood connection is open. (The kept-alive
            # requests must all be answered within the idle timeout for this to hold: a
            # machine too slow for that fails here, saying so.)
            still_open = sum(c.open for c in clients)
            assert still_open == size, (
                f"only {still_open} of {size} open when the normal client asked: the kept-alive "
                f"requests took {numbers['kept-alive requests answered in']:.2f}s"
            )
            answers = await defer.gatherResults(
                [defer.Deferred.fromCoroutine(normal(port, stream)) for stream in (True, False)]
            )
            numbers["flooded latency"] = [seconds for _, _, seconds in answers]
            numbers["still open when answered"] = sum(c.open for c in clients)
            for stream, (response, body, _) in zip((True, False), answers, strict=True):
                expect_served(sim, response, body, stream)

            # 4. Each kind is closed by the proxy after its own timeout, and not before.
            for kind, after, timeout in (
                (Kind.TRICKLE, "started_at", HEAD_TIMEOUT),
                (Kind.IDLE, "started_at", IDLE_TIMEOUT),
                (Kind.SILENT, "dialled_at", SNIFF_TIMEOUT),
            ):
                group = by_kind[kind]
                latest = max(_when(c, after) for c in group)
                left = latest + timeout + LATE - reactor.seconds()
                await poll(all_closed(group), left)
                still = sum(c.open for c in group)
                assert still == 0, f"{still} {kind.value} connections still open"
                lived = [c.closed_at - _when(c, after) for c in group if c.closed_at is not None]
                assert min(lived) >= timeout - EARLY, (kind, spread(lived))
                numbers[f"{kind.value} closed after"] = spread(lived)
                numbers[f"{kind.value} resets"] = sum(bool(c.reset) for c in group)
        finally:
            ticker.stop()

        for client in by_kind[Kind.SILENT]:
            assert client.received == b"" and client.sent == 0
        for client in trickling:
            # Never answered, not even with an error: the head was never complete.
            assert client.received == b"", client.received[:200]
            assert 0 < client.sent < len(TRICKLED_HEAD)
        for client in idle:
            answer = client.answer()
            assert answer.status == 200, answer
            assert json.loads(answer.body)["content"] == "".join(sim.tokens)
            assert client.reset is False  # an orderly close, after the answer
        numbers["trickled bytes"] = spread([c.sent for c in trickling])
        numbers["idle closed after its answer"] = spread(
            [_when(c, "closed_at") - _when(c, "answered_at") for c in idle]
        )
    finally:
        for client in clients:
            client.abort()

    # 5. Everything given back: descriptors (once the sim dropped the pooled connections),
    # nothing in flight or reserved, one terminal event per request, a clean stderr.
    sim.drop_connections()
    assert await poll(lambda: open_fds(pid) == baseline, 5), (open_fds(pid), baseline)
    status = await admin_status(admin_port)
    assert (status["inFlight"], status["reservations"]) == (0, {}), status
    assert await poll(lambda: not terminal_problems(proxy.frames[frames_from:]), 2)
    assert len(workload_events(proxy.frames[frames_from:])) == len(idle) + 2
    assert log_problems(proxy, stderr_from) == []
    print(f"\nslow clients: {numbers}")


def _when(client: FloodClient, attribute: str) -> float:
    value = getattr(client, attribute)
    assert isinstance(value, float), (client.kind, attribute, value)
    return value
