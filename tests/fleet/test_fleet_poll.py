# -*- test-case-name: tests.fleet.test_fleet_poll -*-
"""Standalone fleet polling (:class:`nvpair.fleet.polls.FleetService`;
docs/inventories.md#polled-inventories): every node's poll is bounded as a whole (dial
timeout + 30 s, and in bytes), a poll that hits a bound closes its connection and counts as
failed, and one node's poll never holds up another's schedule.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import capturedLogs

from nvpair.control.state import ControlState, Discovery
from nvpair.fleet.file import FacadeSpec, Fleet, FleetNode
from nvpair.fleet.nodepoll import MAX_INVENTORY_BODY, POLL_GRACE
from nvpair.fleet.polls import FleetService
from nvpair.sim import SimEngine
from nvpair.wire.client.upstream import Upstream
from nvpair.wire.message import Answer, Fields
from nvpair.wire.web import UpstreamClient
from tests.wire.client.test_bodies import FakeResponse, Sent, StallingUpstream, stalling_upstreams

DIAL = 10.0
INTERVAL = 5.0
BOUND = DIAL + POLL_GRACE


def tags(*names: str) -> bytes:
    return json.dumps({"models": [{"name": n} for n in names]}).encode()


class AgentClient:
    """An :class:`~nvpair.wire.web.UpstreamClient` over a :class:`ScriptedAgent`, as the fleet
    sees its client."""

    def __init__(self, agent: ScriptedAgent) -> None:
        self.agent = agent
        self.requests = 0

    def request(
        self,
        base_url: str,
        method: bytes,
        uri: bytes,
        headers: Fields,
        body: bytes | None,
        connected: Callable[[], None] | None = None,
        resend: bool = False,
    ) -> Deferred[Answer]:
        self.requests += 1
        d: Deferred[Answer] = self.agent.request(
            method, base_url.rstrip("/").encode() + uri, headers, None
        )
        return d


class ScriptedAgent:
    """Records each poll by URL; the test answers it."""

    def __init__(self) -> None:
        self.sent: dict[str, list[Sent]] = {}

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Fields | None = None,
        bodyProducer: object = None,
    ) -> Deferred[Answer]:
        sent = Sent()
        self.sent.setdefault(uri.decode(), []).append(sent)
        return sent.deferred

    def polls(self, node: str) -> list[Sent]:
        return self.sent.get(f"http://{node}/api/tags", [])

    def last(self, node: str) -> Sent:
        return self.polls(node)[-1]

    def answer(self, node: str, body: bytes, code: int = 200) -> FakeResponse:
        response = FakeResponse(code, body)
        self.last(node).deferred.callback(response)
        return response


class Facades:
    def __init__(self) -> None:
        self.enabled: list[str] = []

    def enable(
        self, engine_id: str, port: int | None, aliases: Sequence[str], ignore_persisted: bool
    ) -> object:
        self.enabled.append(engine_id)
        return {}


def fleet(*urls: tuple[str, str], interval: float = INTERVAL) -> Fleet:
    nodes = tuple(FleetNode(node, {"ollama": url}) for node, url in urls)
    return Fleet(interval, {"ollama": FacadeSpec(0, ())}, nodes)


def members(control: ControlState) -> dict[str, tuple[str, ...]]:
    return {n.id: n.models for n in control.discovery("ollama").nodes}


class Polling:
    """A FleetService on a Clock with a scripted agent, nodes ``a`` and ``b``."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.agent = ScriptedAgent()
        self.control = ControlState()
        self.facades = Facades()
        self.service = FleetService(
            self.clock,
            fleet(("a", "http://a"), ("b", "http://b")),
            self.control,
            self.facades,
            AgentClient(self.agent),
            DIAL,
        )


@pytest.fixture
def polling() -> Iterator[Polling]:
    harness = Polling()
    harness.service.startService()
    yield harness
    if harness.service.running:
        harness.service.stopService()


def test_each_node_is_polled_at_start_and_joins(polling: Polling) -> None:
    """Immediate poll at start, facades enabled; a node that answers joins discovery."""
    assert polling.facades.enabled == ["ollama"]
    assert len(polling.agent.polls("a")) == len(polling.agent.polls("b")) == 1
    polling.agent.answer("a", tags("llama3:latest"))
    assert members(polling.control) == {"a": ("llama3:latest",)}


def test_a_node_stalled_before_headers_does_not_delay_another(polling: Polling) -> None:
    """``a`` never answers; ``b`` is still polled every interval and its changes land on
    time (one poll used to wait for every node's poll)."""
    polling.agent.answer("b", tags("m1"))
    for tick in range(1, 4):
        polling.clock.advance(INTERVAL)
        assert len(polling.agent.polls("b")) == tick + 1
        polling.agent.answer("b", tags("m1", f"m{tick + 1}"))
        assert members(polling.control)["b"] == ("m1", f"m{tick + 1}")
    # ... and ``a``'s poll still running is never duplicated.
    assert len(polling.agent.polls("a")) == 1


def test_a_node_whose_body_stalls_does_not_delay_another(polling: Polling) -> None:
    polling.agent.last("a").deferred.callback(stalled := FakeResponse())
    stalled.send(b'{"models":[')
    polling.agent.answer("b", tags("m1"))
    polling.clock.advance(INTERVAL)
    polling.agent.answer("b", tags("m2"))
    assert members(polling.control) == {"b": ("m2",)}
    assert len(polling.agent.polls("a")) == 1


def test_a_stalled_body_is_bounded_closed_and_the_node_leaves(polling: Polling) -> None:
    """``a`` joined, then its next answer stalls after the headers: at dial timeout + 30 s
    the connection is closed and ``a`` leaves discovery, with the leave line logged."""
    polling.agent.answer("a", tags("m1"))
    polling.clock.advance(INTERVAL)
    stalled = FakeResponse()
    polling.agent.last("a").deferred.callback(stalled)
    stalled.send(b'{"models":[')
    polling.clock.advance(BOUND - 0.1)
    assert stalled.connection.stopped == 0
    assert "a" in members(polling.control)
    with capturedLogs() as events:
        polling.clock.advance(0.1)
    assert stalled.connection.stopped == 1
    assert "a" not in members(polling.control)
    assert any(
        e.get("log_format", "").startswith("{node} left {engine} discovery")
        and e.get("node") == "a"
        for e in events
    )


def test_headers_that_never_come_are_bounded_too(polling: Polling) -> None:
    polling.agent.answer("a", tags("m1"))
    polling.clock.advance(INTERVAL)
    polling.clock.advance(BOUND)
    assert polling.agent.polls("a")[1].cancels == 1
    assert "a" not in members(polling.control)


def test_after_a_bound_the_node_is_polled_again_and_can_rejoin(polling: Polling) -> None:
    polling.clock.advance(BOUND)
    assert polling.agent.polls("a")[0].cancels == 1
    polling.clock.advance(INTERVAL)
    assert len(polling.agent.polls("a")) == 2
    polling.agent.answer("a", tags("m1"))
    assert members(polling.control)["a"] == ("m1",)


def test_an_inventory_too_large_fails_and_closes(polling: Polling) -> None:
    polling.agent.answer("a", tags("m1"))
    polling.clock.advance(INTERVAL)
    huge = FakeResponse()
    polling.agent.last("a").deferred.callback(huge)
    huge.send(b" " * MAX_INVENTORY_BODY)
    assert "a" in members(polling.control)
    huge.send(b" ")
    assert huge.connection.stopped == 1
    assert "a" not in members(polling.control)


@pytest.mark.parametrize(
    ("code", "body"),
    [
        (500, tags("m1")),
        (200, b"\xff\xfe not utf-8"),
        (200, b"[" * 100_000 + b"]" * 100_000),
        (200, b'{"models": [{"name": ' + b"9" * 5000 + b"}]}"),
        (200, b'{"models": "nope"}'),
        (200, b""),
    ],
    ids=["status", "invalid-utf8", "deep-nesting", "huge-number", "not-envelope", "empty"],
)
def test_a_bad_answer_fails_the_node_and_polling_goes_on(
    polling: Polling, code: int, body: bytes
) -> None:
    polling.agent.answer("a", tags("m1"))
    polling.clock.advance(INTERVAL)
    polling.agent.answer("a", body, code)
    assert "a" not in members(polling.control)
    polling.clock.advance(INTERVAL)
    polling.agent.answer("a", tags("m1"))
    assert members(polling.control)["a"] == ("m1",)


def test_a_failing_discovery_listener_does_not_stop_polling(polling: Polling) -> None:
    def broken(engine: str, snapshot: Discovery) -> None:
        raise RuntimeError("listener bug")

    polling.control.on_discovery(broken)
    with capturedLogs():
        polling.agent.answer("a", tags("m1"))
    polling.clock.advance(INTERVAL)
    assert len(polling.agent.polls("a")) == 2


def test_stopping_cancels_polls_without_emptying_discovery(polling: Polling) -> None:
    """Shutdown cancels the polls in flight (closing them) but is not every node failing."""
    polling.agent.answer("a", tags("m1"))
    polling.clock.advance(INTERVAL)
    polling.service.stopService()
    assert polling.agent.last("a").cancels == 1
    assert polling.agent.last("b").cancels == 1
    assert members(polling.control) == {"a": ("m1",)}
    polling.clock.advance(10 * INTERVAL)
    assert len(polling.agent.polls("a")) == 2
    assert polling.clock.getDelayedCalls() == []


# -- real engines on loopback -------------------------------------------------------------------


@pytest.fixture
def stalling() -> Iterator[Callable[..., StallingUpstream]]:
    yield from stalling_upstreams()


@pytest.fixture
def sim() -> Iterator[SimEngine]:
    engine = SimEngine(reactor, "ollama", models=["llama3:latest"], node="healthy")
    engine.listen()
    yield engine
    pytest_twisted.blockon(engine.refuse())


@pytest.fixture
def pool() -> Iterator[Upstream]:
    client = Upstream(reactor, DIAL)
    yield client
    pytest_twisted.blockon(client.close())


def discovery_update(
    control: ControlState, check: Callable[[dict[str, tuple[str, ...]]], bool]
) -> Deferred[None]:
    """Fires at the first discovery snapshot (or the current one) ``check`` accepts; gives up
    after 5 real seconds so a regression fails rather than hangs."""
    d: Deferred[None] = Deferred()
    fired: list[bool] = []

    def seen(engine: str, snapshot: Discovery) -> None:
        if not fired and check({n.id: n.models for n in snapshot.nodes}):
            fired.append(True)
            # Resumed on a later turn: the poll that produced the snapshot has then finished,
            # as far as its schedule knows, before the test moves the clock on.
            reactor.callLater(0, d.callback, None)

    if check(members(control)):
        d.callback(None)
        return d
    unsubscribe = control.on_discovery(seen)
    d.addBoth(lambda result: (unsubscribe(), result)[1])
    return d.addTimeout(5.0, reactor)


@pytest_twisted.ensureDeferred
async def test_real_stalled_node_does_not_hold_up_a_healthy_one(
    stalling: Callable[..., StallingUpstream], sim: SimEngine, pool: Upstream
) -> None:
    """A real node stalls its /api/tags body after the headers; the healthy simulated node
    still joins, its model change lands at the next tick, and at the bound the stalled
    poll's connection is closed (the server sees it) and that node stays out."""
    stalled = stalling(head=b'{"models":[', length=4096)
    clock, control = Clock(), ControlState()
    service = FleetService(
        clock,
        fleet(("stalled", stalled.url), ("healthy", sim.url)),
        control,
        Facades(),
        pool,
        DIAL,
    )
    service.startService()
    try:
        await discovery_update(control, lambda m: m.get("healthy") == ("llama3:latest",))
        await stalled.arrived(1)
        sim.models.append("phi3:latest")
        clock.advance(INTERVAL)
        await discovery_update(
            control, lambda m: m.get("healthy") == ("llama3:latest", "phi3:latest")
        )
        assert len(stalled.exchanges) == 1 and stalled.lost == 0
        clock.advance(BOUND - INTERVAL)
        await stalled.lost_count(1)
        assert "stalled" not in members(control)
    finally:
        service.stopService()


@pytest_twisted.ensureDeferred
async def test_real_stop_closes_a_poll_in_flight(
    stalling: Callable[..., StallingUpstream], pool: Upstream
) -> None:
    stalled = stalling(head=b'{"models":[')
    service = FleetService(
        Clock(),
        fleet(("stalled", stalled.url)),
        ControlState(),
        Facades(),
        pool,
        DIAL,
    )
    service.startService()
    await stalled.arrived(1)
    service.stopService()
    await stalled.lost_count(1)


@pytest_twisted.ensureDeferred
async def test_real_polls_travel_through_the_shared_upstream_client(sim: SimEngine) -> None:
    """Polls go through the client the process shares (and shuts down with everything else)."""
    from nvpair.wire.client.upstream import Upstream

    control = ControlState()
    upstream = Upstream(reactor, DIAL)
    counting = Counting(upstream)
    service = FleetService(
        reactor, fleet(("n", sim.url), interval=60.0), control, Facades(), counting, DIAL
    )
    service.startService()
    try:
        await discovery_update(control, lambda m: "n" in m)
        assert counting.requests == 1
    finally:
        service.stopService()
        await upstream.close()


class Counting:
    def __init__(self, inner: UpstreamClient) -> None:
        self.inner = inner
        self.requests = 0

    def request(
        self,
        base_url: str,
        method: bytes,
        uri: bytes,
        headers: Fields,
        body: bytes | None,
        connected: Callable[[], None] | None = None,
        resend: bool = False,
    ) -> Deferred[Answer]:
        self.requests += 1
        d: Deferred[Answer] = self.inner.request(
            base_url, method, uri, headers, body, connected, resend
        )
        return d
