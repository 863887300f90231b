"""A fault matrix through the real process, for each dialect (docs/request-path.md).

One ``twistd -n nvpair-proxy`` per dialect (module-scoped), in broker mode with the admin listener
on and shrunk bounds, in front of simulated nodes of that dialect. Each case puts a fault on the
first-chosen node (``node-a``; ``node-b`` stays healthy, so failover is observable), sends
streaming and whole inference requests, and asserts the documented answer: a relayed answer
names its node (``X-Nvpair-Node``, and the simulated text names it too), a proxy-generated one
its reason (``X-Nvpair-Error`` and the dialect's error body). Then :meth:`Rig.settled` checks
what must hold after *any* case: nothing in flight and no reservation left (admin ``/status``),
no upstream answer left open on a sim, exactly one terminal workload event per admitted request
(counted by workload id from the frames), the proxy's open file descriptors back to the warm-up
baseline once the sims dropped the pooled keep-alive connections, and no traceback or error
record on its stderr.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from io import BytesIO
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest
import pytest_twisted
from twisted.internet import defer, reactor, task
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import Agent, FileBodyProducer, HTTPConnectionPool, ResponseDone
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from nvpair.sim import SimEngine
from tests.integration.conftest import running_proxy, sims
from tests.integration.harness import (
    Frame,
    ProxyProcess,
    free_port,
    log_problems,
    open_fds,
    stderr_mark,
    terminal_problems,
    workload_events,
)

pytestmark = pytest.mark.integration

T = TypeVar("T")

#: Per-attempt header and first-body cap; a stall costs this much before failover.
TIMEOUT = 2.0
ARGS = (
    "--response-header-timeout",
    f"{TIMEOUT:g}s",
    "--job-deadline",
    "10s",
    "--retry-backoff",
    "50ms",
    "--dial-timeout",
    "2s",
)
NODES = ("node-a", "node-b", "node-c")
MODES = [pytest.param(True, id="stream"), pytest.param(False, id="whole")]


# -- the dialects ---------------------------------------------------------------------------------


@attrs.frozen
class Dialect:
    """What one engine's inference requests look like."""

    engine: str
    model: str
    path: str
    fields: dict[str, Any]

    def body(self, stream: bool, model: str | None = None) -> bytes:
        return json.dumps({"model": model or self.model, **self.fields, "stream": stream}).encode()

    def refusal_code(self, body: bytes) -> str | None:
        """The reason in a proxy-generated body, in the route's dialect (None when the shape
        carries only a message: Ollama's native routes)."""
        parsed = json.loads(body)
        if self.engine == "ollama" and not self.path.startswith("/v1/"):
            assert isinstance(parsed["error"], str), parsed
            return None
        assert parsed["error"]["type"] == "nvpair_proxy", parsed
        code = parsed["error"]["code"]
        assert isinstance(code, str)
        return code


CHAT = [{"role": "user", "content": "one two three"}]
DIALECTS = {
    "ollama": Dialect("ollama", "llama3:latest", "/api/chat", {"messages": CHAT}),
    "lmstudio": Dialect("lmstudio", "qwen", "/v1/chat/completions", {"messages": CHAT}),
    "llamacpp": Dialect("llamacpp", "tiny", "/completion", {"prompt": "one two three"}),
}


# -- a client that keeps whatever arrived ---------------------------------------------------------


@attrs.frozen
class Answer:
    """One request's answer as the client saw it.

    :ivar status: ``None`` when the connection ended before a response head.
    :ivar complete: the body ended cleanly (not cut by a reset or a close).
    """

    status: int | None
    headers: dict[str, list[str]]
    body: bytes
    complete: bool
    seconds: float

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return values[0] if values else None


class _Body(Protocol):
    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.ended: Deferred[bool] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.data.append(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        # Fires with whether the body ended cleanly (a Failure would fire the errback).
        self.ended.callback(reason.check(ResponseDone) is not None)


# Not persistent: no client connection to the proxy outlives its request, so the proxy's open
# descriptors can be compared with the baseline after every case.
_AGENT = Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False))


async def fetch(method: bytes, url: str, body: bytes | None = None) -> Answer:
    began = reactor.seconds()
    headers = Headers({b"content-type": [b"application/json"]})
    producer = FileBodyProducer(BytesIO(body)) if body is not None else None
    sent: Deferred[IResponse] = _AGENT.request(method, url.encode(), headers, producer)
    sent.addTimeout(30, reactor)
    try:
        response = await sent
    except Exception:
        return Answer(None, {}, b"", False, reactor.seconds() - began)
    collector = _Body()
    response.deliverBody(collector)
    complete = await collector.ended.addTimeout(30, reactor)
    received = {
        name.decode().lower(): [v.decode() for v in values]
        for name, values in response.headers.getAllRawHeaders()
    }
    return Answer(
        response.code,
        received,
        b"".join(collector.data),
        complete,
        reactor.seconds() - began,
    )


async def sleep(seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


async def eventually(
    probe: Callable[[], Awaitable[T]], done: Callable[[T], bool], timeout: float = 5.0
) -> T:
    """Poll ``probe`` until ``done`` holds; the last value either way (the caller asserts)."""
    deadline = reactor.seconds() + timeout
    while True:
        got = await probe()
        if done(got) or reactor.seconds() >= deadline:
            return got
        await sleep(0.02)


def at_once(read: Callable[[], T]) -> Callable[[], Awaitable[T]]:
    """A synchronous probe for :func:`eventually`."""
    return lambda: defer.succeed(read())


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    assert await eventually(at_once(check), bool, timeout), "condition not reached in time"


# -- the rig --------------------------------------------------------------------------------------


@attrs.frozen
class Terminal:
    """An expected terminal event: state, error, and (when given) the node it names."""

    state: str
    error: str | None = None
    node: str | None = None


COMPLETED = Terminal("completed")


@attrs.define(eq=False)
class Rig:
    """One dialect's proxy process and its simulated nodes, shared by the cases."""

    dialect: Dialect
    proxy: ProxyProcess
    engines: Sequence[SimEngine]
    port: int
    admin_port: int
    baseline_fds: int = 0
    frames_from: int = 0
    stderr_from: int = 0

    @property
    def a(self) -> SimEngine:
        return self.engines[0]

    @property
    def b(self) -> SimEngine:
        return self.engines[1]

    @property
    def c(self) -> SimEngine:
        return self.engines[2]

    def snapshot(self, *engines: SimEngine, extra: Sequence[str] = ()) -> list[Frame]:
        return [
            {"id": e.node, "url": e.url, "models": [self.dialect.model, *extra]} for e in engines
        ]

    def discover(self, *engines: SimEngine) -> None:
        self.proxy.discovery(self.dialect.engine, self.snapshot(*engines))

    async def reset(self) -> None:
        """Every node healthy and idle, discovery back to node-a and node-b, counters zeroed."""
        for engine in self.engines:
            engine.faults.clear()
            engine.resume()
            engine.chunk_interval = 0.0
            engine.requests.clear()
            engine.abandoned = 0
            engine.headers_sent = 0
        self.discover(self.a, self.b)
        await self.proxy.barrier()
        self.frames_from = len(self.proxy.frames)
        self.stderr_from = stderr_mark(self.proxy)

    def ask(self, stream: bool = True, model: str | None = None) -> Deferred[Answer]:
        url = f"http://127.0.0.1:{self.port}{self.dialect.path}"
        return Deferred.fromCoroutine(fetch(b"POST", url, self.dialect.body(stream, model)))

    async def status(self) -> dict[str, Any]:
        answer = await fetch(b"GET", f"http://127.0.0.1:{self.admin_port}/status")
        assert answer.status == 200, answer
        status: dict[str, Any] = json.loads(answer.body)
        return status

    def served_by(self, answer: Answer) -> SimEngine:
        """The node whose text the answer carries (for cases where either may serve)."""
        return next((e for e in self.engines if e.node.encode() in answer.body), self.a)

    def case_frames(self) -> list[Frame]:
        return self.proxy.frames[self.frames_from :]

    # -- what a case asserts about its answers ------------------------------------------------

    def expect_served(self, answer: Answer, engine: SimEngine, complete: bool = True) -> None:
        """``engine``'s answer was relayed: its status, its text, no proxy reason."""
        assert answer.status == 200, answer
        assert answer.header("x-nvpair-error") is None, answer
        assert answer.header("x-nvpair-node") == engine.node, answer
        assert engine.node.encode() in answer.body, answer
        others = [e.node for e in self.engines if e is not engine]
        assert not any(node.encode() in answer.body for node in others), answer
        assert answer.complete is complete, answer

    def expect_refused(self, answer: Answer, status: int, reason: str) -> None:
        """The proxy answered for itself: the documented status, reason header and body
        (docs/request-path.md#proxy-generated-answers)."""
        assert answer.status == status, answer
        assert answer.header("x-nvpair-error") == reason, answer
        assert answer.complete, answer
        assert self.dialect.refusal_code(answer.body) in (None, reason), answer

    # -- what must hold after every case --------------------------------------------------------

    async def settled(self, *expected: Terminal) -> list[dict[str, Any]]:
        """Assert the after-case invariants; returns the terminal ``workloadInfo``s."""
        # Nothing in flight, no reservation (the last callbacks may still be running).
        status = await eventually(
            self.status, lambda s: s["inFlight"] == 0 and s["reservations"] == {}
        )
        assert (status["inFlight"], status["reservations"]) == (0, {}), status

        # Exactly one terminal event per admitted request; the process counted it out of
        # flight in the same turn, so its frame is at most a pipe away.
        def unfinished() -> list[str]:
            return terminal_problems(self.case_frames())

        assert await eventually(at_once(unfinished), lambda p: not p, timeout=2) == []
        events = workload_events(self.case_frames())
        terminals = [e[-1]["params"]["workloadInfo"] for e in events.values()]
        got = Counter((i["state"], i["error"]) for i in terminals)
        assert got == Counter((t.state, t.error) for t in expected), terminals
        for want in expected:
            if want.node is not None:
                assert any(
                    (i["state"], i["error"], i.get("scheduledOn"))
                    == (want.state, want.error, want.node)
                    for i in terminals
                ), terminals

        # No upstream answer left open: an abandoned attempt's connection was closed by the
        # proxy, not by the sims dropping their connections below.
        def delivering() -> list[int]:
            return [engine.in_flight for engine in self.engines]

        idle = [0] * len(self.engines)
        assert await eventually(at_once(delivering), lambda n: n == idle, timeout=2) == idle

        # Descriptors back to the baseline once the pooled keep-alive connections are gone.
        for engine in self.engines:
            engine.drop_connections()
        pid = self.proxy.pid
        fds = await eventually(at_once(lambda: open_fds(pid)), lambda n: n == self.baseline_fds, 3)
        assert fds == self.baseline_fds, f"{fds} open descriptors, {self.baseline_fds} at start"

        assert log_problems(self.proxy, self.stderr_from) == []
        return terminals


async def _warm_up(rig: Rig) -> None:
    """Serve through each node once (both modes), then take the descriptor baseline with no
    pooled connection left."""
    for engine in (rig.a, rig.b):
        rig.discover(engine)
        await rig.proxy.barrier()
        for stream in (True, False):
            rig.expect_served(await rig.ask(stream), engine)
    for engine in rig.engines:
        engine.drop_connections()
    pid = rig.proxy.pid
    previous = -1
    for _ in range(50):  # settle: the same count twice, 100 ms apart
        await sleep(0.1)
        count = open_fds(pid)
        if count == previous:
            break
        previous = count
    rig.baseline_fds = previous


@pytest_twisted.async_yield_fixture(scope="module", params=sorted(DIALECTS))
async def dialect_rig(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Rig]:
    dialect = DIALECTS[request.param]
    specs = [(dialect.engine, [dialect.model], node) for node in NODES]
    admin_port = free_port()
    state = tmp_path_factory.mktemp(f"matrix-{dialect.engine}")
    async with (
        sims(*specs) as engines,
        running_proxy(state, *ARGS, "--admin-port", str(admin_port)) as proxy,
    ):
        proxy.answer_subscribes()
        port = free_port()
        await proxy.enable(dialect.engine, port)
        rig = Rig(dialect, proxy, engines, port, admin_port)
        await rig.reset()
        await _warm_up(rig)
        yield rig


@pytest_twisted.async_fixture
async def rig(dialect_rig: Rig) -> Rig:
    await dialect_rig.reset()
    return dialect_rig


def tallies(rig: Rig) -> tuple[int, ...]:
    return tuple(len(e.requests) for e in rig.engines)


# -- faults on the first-chosen node --------------------------------------------------------------


@pytest.mark.parametrize("stream", MODES)
@pytest_twisted.ensureDeferred
async def test_connection_refused_fails_over(rig: Rig, stream: bool) -> None:
    await rig.a.refuse()
    rig.expect_served(await rig.ask(stream), rig.b)
    assert tallies(rig) == (0, 1, 0)
    await rig.settled(Terminal("completed", node="node-b"))


@pytest.mark.parametrize("stream", MODES)
@pytest_twisted.ensureDeferred
async def test_reset_before_headers_fails_over(rig: Rig, stream: bool) -> None:
    rig.a.faults.reset_before_headers = True
    rig.expect_served(await rig.ask(stream), rig.b)
    assert tallies(rig) == (1, 1, 0)
    await rig.settled(Terminal("completed", node="node-b"))


@pytest.mark.parametrize("stream", MODES)
@pytest_twisted.ensureDeferred
async def test_headers_then_silence_fails_over_at_the_first_body_timeout(
    rig: Rig, stream: bool
) -> None:
    rig.a.faults.stall = True
    answer = await rig.ask(stream)
    rig.expect_served(answer, rig.b)
    assert TIMEOUT <= answer.seconds < TIMEOUT + 2, answer.seconds
    assert tallies(rig) == (1, 1, 0)
    # The silent attempt's upstream connection was closed, not left open.
    await until(lambda: rig.a.abandoned == 1 and rig.a.in_flight == 0)
    await rig.settled(Terminal("completed", node="node-b"))


@pytest.mark.parametrize("stream", MODES)
@pytest_twisted.ensureDeferred
async def test_partial_body_then_reset_truncates_without_failover(rig: Rig, stream: bool) -> None:
    whole = await rig.ask(stream)  # node-a's intact answer, for comparison
    rig.expect_served(whole, rig.a)
    rig.a.requests.clear()
    if stream:
        rig.a.faults.die_after_chunks = 2
    else:
        rig.a.faults.die_after_bytes = 9
    answer = await rig.ask(stream)
    # Committed at the first byte: the client sees the cut, nobody else is asked.
    assert answer.status == 200 and not answer.complete, answer
    assert answer.header("x-nvpair-error") is None
    assert answer.header("x-nvpair-node") == "node-a"
    if stream:
        # Exactly the two pieces node-a sent before the reset (NDJSON lines or SSE events).
        end = b"\n\n" if answer.body.startswith((b"data:", b"event:")) else b"\n"
        assert answer.body.endswith(end) and answer.body.count(end) == 2, answer.body
        assert len(answer.body) < len(whole.body)
    else:
        assert answer.body == whole.body[:9]
    assert tallies(rig) == (1, 0, 0)
    # A committed 2xx cut by its node still completed (docs/request-path.md#workload-lifecycle).
    await rig.settled(COMPLETED, Terminal("completed", node="node-a"))


@pytest_twisted.ensureDeferred
async def test_ok_status_with_an_error_body_passes_through(rig: Rig) -> None:
    rig.a.faults.status = 200
    answer = await rig.ask()
    rig.expect_served(answer, rig.a)
    assert b"simulated failure on node-a (HTTP 200)" in answer.body
    assert tallies(rig) == (1, 0, 0)
    await rig.settled(Terminal("completed", node="node-a"))


@pytest.mark.parametrize("stream", MODES)
@pytest_twisted.ensureDeferred
async def test_retryable_status_fails_over(rig: Rig, stream: bool) -> None:
    rig.a.faults.status = 503
    rig.expect_served(await rig.ask(stream), rig.b)
    assert tallies(rig) == (1, 1, 0)
    await rig.settled(Terminal("completed", node="node-b"))


@pytest_twisted.ensureDeferred
async def test_non_retryable_status_passes_through(rig: Rig) -> None:
    rig.a.faults.status = 400
    answer = await rig.ask()
    assert answer.status == 400 and answer.complete, answer
    assert answer.header("x-nvpair-error") is None
    assert answer.header("x-nvpair-node") == "node-a"
    assert b"simulated failure on node-a (HTTP 400)" in answer.body
    assert tallies(rig) == (1, 0, 0)
    await rig.settled(Terminal("failed", "upstream status 400", "node-a"))


@pytest_twisted.ensureDeferred
async def test_the_final_attempt_answers_with_its_own_status(rig: Rig) -> None:
    rig.a.faults.status = 503
    rig.b.faults.status = 503
    answer = await rig.ask()
    # Five dispatches (a, b | a, b | a): the fifth is the answer, status and body unchanged.
    assert answer.status == 503 and answer.complete, answer
    assert answer.header("x-nvpair-error") is None
    assert answer.header("x-nvpair-node") == "node-a"
    assert b"simulated failure on node-a (HTTP 503)" in answer.body
    assert tallies(rig) == (3, 2, 0)
    await rig.settled(Terminal("failed", "upstream status 503", "node-a"))


@pytest_twisted.ensureDeferred
async def test_every_owner_refusing_ends_in_upstream_transport(rig: Rig) -> None:
    await rig.a.refuse()
    await rig.b.refuse()
    answer = await rig.ask()
    rig.expect_refused(answer, 502, "upstream-transport")
    await rig.settled(Terminal("failed", "upstream-transport"))


@pytest_twisted.ensureDeferred
async def test_a_model_nobody_has_is_not_admitted(rig: Rig) -> None:
    answer = await rig.ask(model="nobody-has-this")
    rig.expect_refused(answer, 502, "no-owner")
    assert tallies(rig) == (0, 0, 0)
    await rig.settled()  # no workload events at all


# -- a node leaving discovery, in each phase ------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_node_left_before_admission_gets_nothing(rig: Rig) -> None:
    rig.discover(rig.b)
    await rig.proxy.barrier()
    rig.expect_served(await rig.ask(), rig.b)
    assert tallies(rig) == (0, 1, 0)
    await rig.settled(Terminal("completed", node="node-b"))


@pytest_twisted.ensureDeferred
async def test_node_left_after_planning_before_its_dispatch_gets_nothing(rig: Rig) -> None:
    """The round is planned as node-a, node-b, node-c; node-b leaves while node-a is being
    tried (and answers 503 late): node-b must be skipped, node-c answers."""
    rig.discover(rig.a, rig.b, rig.c)
    await rig.proxy.barrier()
    rig.a.faults.status = 503
    rig.a.faults.header_delay = 0.5
    pending = rig.ask()
    await until(lambda: len(rig.a.requests) == 1)
    rig.discover(rig.a, rig.c)
    answer = await pending
    assert tallies(rig)[1] == 0, "node-b was dispatched to after it left discovery"
    rig.expect_served(answer, rig.c)
    await rig.settled(Terminal("completed", node="node-c"))


@pytest.mark.parametrize("stream", MODES)
@pytest_twisted.ensureDeferred
async def test_node_left_while_awaiting_headers_fails_over_at_once(rig: Rig, stream: bool) -> None:
    rig.a.faults.header_delay = 30
    pending = rig.ask(stream)
    await until(lambda: len(rig.a.requests) == 1)
    rig.discover(rig.b)
    answer = await pending
    rig.expect_served(answer, rig.b)
    assert answer.seconds < TIMEOUT, "failed over by the header timeout, not by the watcher"
    await until(lambda: rig.a.abandoned == 1 and rig.a.in_flight == 0)
    assert tallies(rig) == (1, 1, 0)
    await rig.settled(Terminal("completed", node="node-b"))


@pytest.mark.parametrize("stream", MODES)
@pytest_twisted.ensureDeferred
async def test_node_left_while_awaiting_the_first_byte_fails_over_at_once(
    rig: Rig, stream: bool
) -> None:
    rig.a.faults.first_byte_delay = 30
    pending = rig.ask(stream)
    await until(lambda: rig.a.headers_sent == 1)
    await sleep(0.05)  # loopback: the head is at the proxy by now
    rig.discover(rig.b)
    answer = await pending
    rig.expect_served(answer, rig.b)
    assert answer.seconds < TIMEOUT, "failed over by the first-body timeout, not the watcher"
    await until(lambda: rig.a.abandoned == 1 and rig.a.in_flight == 0)
    assert tallies(rig) == (1, 1, 0)
    await rig.settled(Terminal("completed", node="node-b"))


@pytest_twisted.ensureDeferred
async def test_node_left_while_streaming_finishes_the_stream(rig: Rig) -> None:
    rig.a.chunk_interval = 0.15
    pending = rig.ask(stream=True)

    def started() -> bool:
        return any(f.get("method") == "workload:started" for f in rig.case_frames())

    await until(started)
    rig.discover(rig.b)
    # After commit there is no retry and no cancellation: the stream runs to its end.
    rig.expect_served(await pending, rig.a)
    assert tallies(rig) == (1, 0, 0) and rig.a.abandoned == 0
    await rig.settled(Terminal("completed", node="node-a"))


@pytest_twisted.ensureDeferred
async def test_every_owner_left_mid_attempt_and_one_came_back(rig: Rig) -> None:
    """The only owners leave while node-a is being tried; the request waits (at no attempt's
    cost) and is served by node-b once it is back."""
    rig.a.faults.header_delay = 30
    pending = rig.ask()
    await until(lambda: len(rig.a.requests) == 1)
    rig.discover()
    await sleep(0.4)
    assert not pending.called
    rig.discover(rig.b)
    answer = await pending
    rig.expect_served(answer, rig.b)
    assert 0.4 <= answer.seconds < TIMEOUT, answer.seconds
    await until(lambda: rig.a.abandoned == 1 and rig.a.in_flight == 0)
    assert tallies(rig) == (1, 1, 0)
    await rig.settled(Terminal("completed", node="node-b"))


# -- discovery churn under load -------------------------------------------------------------------


def _repeat(every: float, step: Callable[[], None]) -> task.LoopingCall:
    loop = task.LoopingCall(step)
    loop.clock = reactor
    loop.start(every, now=True)
    return loop


@pytest_twisted.ensureDeferred
async def test_flapping_discovery_during_a_burst(rig: Rig) -> None:
    """node-a leaves and rejoins every 15 ms while 20 requests run: each is served whole by
    exactly one node, and each gets exactly one terminal event."""
    for engine in (rig.a, rig.b):
        engine.faults.first_byte_delay = 0.01  # a pre-commit window for the watcher
        engine.chunk_interval = 0.02
    flips = itertools.cycle([(rig.b,), (rig.a, rig.b)])
    flapper = _repeat(0.015, lambda: rig.discover(*next(flips)))
    pending: list[Deferred[Answer]] = []
    try:
        for _ in range(20):  # staggered, so admissions meet both snapshots
            pending.append(rig.ask(stream=True))
            await sleep(0.011)
        answers = await defer.gatherResults(pending)
    finally:
        flapper.stop()
    served = Counter(rig.served_by(answer) for answer in answers)
    for answer in answers:
        rig.expect_served(answer, rig.served_by(answer))
    assert rig.a.abandoned >= 1, "the flapping never caught an attempt: the case tested nothing"
    # Every dispatch was either served whole or abandoned before its first byte.
    assert tallies(rig) == (served[rig.a] + rig.a.abandoned, served[rig.b], 0)
    assert rig.b.abandoned == 0
    await rig.settled(*[COMPLETED] * 20)


@pytest_twisted.ensureDeferred
async def test_snapshot_storm_leaves_requests_alone(rig: Rig) -> None:
    """100 snapshots a second for 2 s, every one keeping both nodes (order and extra models
    vary): no attempt is cancelled, every request is dispatched once and served."""
    variants = itertools.cycle(
        [
            rig.snapshot(rig.a, rig.b),
            rig.snapshot(rig.b, rig.a, extra=["other"]),
            rig.snapshot(rig.a, rig.b, extra=["other", "more"]),
        ]
    )
    sent = 0
    began = reactor.seconds()
    ends = began + 2.0

    def storm() -> None:
        # Catch up on ticks a busy reactor skipped: the rate holds, not just the interval.
        nonlocal sent
        due = min(200, int((reactor.seconds() - began) * 100) + 1)
        for _ in range(due - sent):
            rig.proxy.discovery(rig.dialect.engine, next(variants))
        sent = max(sent, due)

    for engine in (rig.a, rig.b):
        engine.chunk_interval = 0.01
    answers: list[Answer] = []
    storming = _repeat(0.01, storm)

    async def worker(stream: bool) -> None:
        while reactor.seconds() < ends:
            answers.append(await rig.ask(stream))

    try:
        await defer.gatherResults(
            [Deferred.fromCoroutine(worker(stream)) for stream in (True, False, True, False)]
        )
    finally:
        storming.stop()
    assert sent >= 195, sent
    assert len(answers) >= 8
    for answer in answers:
        rig.expect_served(answer, rig.served_by(answer))
    assert sum(tallies(rig)) == len(answers), "an attempt was cancelled or retried"
    assert (rig.a.abandoned, rig.b.abandoned) == (0, 0)
    await rig.settled(*[COMPLETED] * len(answers))


# -- the broker link closing under load (a process of its own: it ends) ---------------------------


@pytest.mark.parametrize("engine", sorted(DIALECTS))
@pytest_twisted.ensureDeferred
async def test_broker_link_closing_under_load(tmp_path: Path, engine: str) -> None:
    """EOF on stdin with ten requests in flight (some awaiting headers, some streaming): the
    process exits 0 and every admitted request got exactly one terminal event, ``cancelled``
    by ``shutdown``, before it did."""
    dialect = DIALECTS[engine]
    specs = [(engine, [dialect.model], node) for node in NODES[:2]]
    async with sims(*specs) as (a, b), running_proxy(tmp_path, *ARGS) as proxy:
        rig = Rig(dialect, proxy, (a, b), free_port(), 0)
        proxy.answer_subscribes()
        await proxy.enable(engine, rig.port)
        rig.discover(a, b)
        await proxy.barrier()
        a.faults.header_delay = 30  # awaiting headers
        b.chunk_interval = 0.5  # committed and streaming slowly
        pending = [rig.ask(stream=True) for _ in range(10)]
        await until(lambda: a.in_flight + b.in_flight == 10)
        await until(lambda: any(f.get("method") == "workload:started" for f in proxy.frames))
        proxy.close_stdin()
        assert await proxy.ended.addTimeout(15, reactor) == 0
        assert terminal_problems(proxy.frames) == []
        events = workload_events(proxy.frames)
        assert len(events) == 10
        terminals = [e[-1]["params"]["workloadInfo"] for e in events.values()]
        assert {(i["state"], i["error"]) for i in terminals} == {("cancelled", "shutdown")}
        answers = await defer.gatherResults(pending)
        assert not any(answer.complete for answer in answers), answers
        committed = [answer for answer in answers if answer.status is not None]
        assert committed and all(answer.status == 200 for answer in committed)
        assert log_problems(proxy) == []
