# -*- test-case-name: tests.fleet.test_fleet_loadpoll -*-
"""Load states polled with the inventory (issue 13 item 1; docs/fleet-scheduling.md#load-state):
each (node, engine) poll also asks the engine's load routes, with the same bounds and the same
independence as the inventory poll, and a node whose engine says it is loading stays in
discovery with its last models."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from nvpair.control.state import ControlState
from nvpair.engines.loadstate import UNKNOWN, LoadState
from nvpair.fleet.file import FacadeSpec, Fleet, FleetNode
from nvpair.fleet.health import HealthPolicy
from nvpair.fleet.nodepoll import MAX_INVENTORY_BODY
from nvpair.fleet.polls import FleetService
from nvpair.fleet.scheduling import FleetScheduler
from nvpair.sim import SimEngine
from nvpair.wire.client.upstream import Upstream
from nvpair.wire.message import Answer
from tests.fleet.test_fleet_poll import (
    BOUND,
    DIAL,
    INTERVAL,
    AgentClient,
    Facades,
    ScriptedAgent,
    discovery_update,
    members,
    tags,
)
from tests.wire.client.test_bodies import FakeResponse

POLICY = HealthPolicy(3, 5.0, 120.0)


class LoadPolling:
    """A FleetService with a scheduler on a Clock, scripted answers, nodes ``a`` and ``b``."""

    def __init__(self, engine: str = "ollama") -> None:
        self.engine = engine
        self.clock = Clock()
        self.agent = ScriptedAgent()
        self.control = ControlState()
        self.scheduler = FleetScheduler(self.clock, POLICY)
        nodes = tuple(FleetNode(n, {engine: f"http://{n}"}) for n in ("a", "b"))
        self.service = FleetService(
            self.clock,
            Fleet(INTERVAL, {engine: FacadeSpec(0, ())}, nodes),
            self.control,
            Facades(),
            AgentClient(self.agent),
            DIAL,
            self.scheduler,
        )

    def sent(self, node: str, path: str) -> list[object]:
        return list(self.agent.sent.get(f"http://{node}{path}", []))

    def pending(self, node: str, path: str) -> list[Deferred[Answer]]:
        """The requests for ``path`` not answered yet: llama.cpp's model list is asked twice
        a poll, for the inventory and for a router's model states."""
        sent = self.agent.sent.get(f"http://{node}{path}", [])
        return [request.deferred for request in sent if not request.deferred.called]

    def answer(self, node: str, path: str, body: bytes, code: int = 200) -> FakeResponse:
        """Every request for ``path`` still out gets this answer; the last one's is returned."""
        pending = self.pending(node, path)
        assert pending, f"nothing asked of {node}{path}"
        for deferred in pending:
            response = FakeResponse(code, body)
            deferred.callback(response)
        return response

    def load(self, node: str) -> LoadState:
        return self.scheduler.load(self.engine, node)

    def nodes(self) -> dict[str, tuple[str, ...]]:
        return {n.id: n.models for n in self.control.discovery(self.engine).nodes}


@pytest.fixture
def polling() -> Iterator[LoadPolling]:
    harness = LoadPolling()
    harness.service.startService()
    yield harness
    if harness.service.running:
        harness.service.stopService()


def ps(*names: str) -> bytes:
    return json.dumps(
        {"models": [{"name": n, "expires_at": "2026-01-01T00:00:00Z"} for n in names]}
    ).encode()


def test_each_poll_reads_the_load_state_too(polling: LoadPolling) -> None:
    assert len(polling.sent("a", "/api/ps")) == len(polling.sent("a", "/api/tags")) == 1
    polling.answer("a", "/api/tags", tags("llama3:latest", "phi3:latest"))
    polling.answer("a", "/api/ps", ps("llama3:latest"))
    assert members(polling.control) == {"a": ("llama3:latest", "phi3:latest")}
    assert polling.load("a").warm == frozenset({"registry.ollama.ai/library/llama3:latest"})
    # The next poll's reading replaces it.
    polling.clock.advance(INTERVAL)
    polling.answer("a", "/api/tags", tags("llama3:latest", "phi3:latest"))
    polling.answer("a", "/api/ps", ps())
    assert polling.load("a").warm == frozenset()


def test_the_inventory_does_not_wait_for_the_load_answer(polling: LoadPolling) -> None:
    polling.answer("a", "/api/tags", tags("m1"))
    assert members(polling.control) == {"a": ("m1",)} and polling.load("a") == UNKNOWN
    # ... and the pair's next poll waits for both: never two at once.
    polling.clock.advance(INTERVAL)
    assert len(polling.sent("a", "/api/tags")) == 1
    polling.answer("a", "/api/ps", ps("m1"))
    polling.clock.advance(INTERVAL)
    assert len(polling.sent("a", "/api/tags")) == len(polling.sent("a", "/api/ps")) == 2


def test_a_stalled_load_answer_is_bounded_and_holds_up_nobody_else(polling: LoadPolling) -> None:
    polling.answer("a", "/api/tags", tags("m1"))
    stalled = FakeResponse()
    polling.agent.sent["http://a/api/ps"][-1].deferred.callback(stalled)
    stalled.send(b'{"models":[')
    for _ in range(3):
        polling.answer("b", "/api/tags", tags("m2"))
        polling.answer("b", "/api/ps", ps("m2"))
        polling.clock.advance(INTERVAL)
    assert polling.load("b").warm == frozenset({"registry.ollama.ai/library/m2:latest"})
    polling.clock.advance(BOUND - 3 * INTERVAL)
    assert stalled.connection.stopped == 1
    assert polling.load("a") == UNKNOWN and "a" in members(polling.control)


def test_a_load_answer_too_large_is_closed_and_unknown(polling: LoadPolling) -> None:
    polling.answer("a", "/api/tags", tags("m1"))
    huge = FakeResponse()
    polling.agent.sent["http://a/api/ps"][-1].deferred.callback(huge)
    huge.send(b" " * (MAX_INVENTORY_BODY + 1))
    assert huge.connection.stopped == 1 and polling.load("a") == UNKNOWN


@pytest.mark.parametrize(
    ("code", "body"),
    [
        (500, ps("m1")),
        (200, b"[" * 100_000 + b"]" * 100_000),
        (200, b'{"models": [{"name": ' + b"9" * 5000 + b"}]}"),
        (200, b'{"models": [{"name": 7}]}'),
        (200, b"\xff"),
    ],
    ids=["status", "deep-nesting", "huge-number", "wrong-type", "not-utf8"],
)
def test_a_hostile_load_answer_is_unknown_and_the_node_stays(
    polling: LoadPolling, code: int, body: bytes
) -> None:
    polling.answer("a", "/api/tags", tags("m1"))
    polling.answer("a", "/api/ps", ps("m1"))
    polling.clock.advance(INTERVAL)
    polling.answer("a", "/api/tags", tags("m1"))
    polling.answer("a", "/api/ps", body, code)
    assert polling.load("a") == UNKNOWN and members(polling.control) == {"a": ("m1",)}


def test_stopping_cancels_the_load_polls_too(polling: LoadPolling) -> None:
    polling.answer("a", "/api/tags", tags("m1"))
    polling.service.stopService()
    assert polling.agent.sent["http://a/api/ps"][-1].cancels == 1
    assert polling.agent.sent["http://b/api/ps"][-1].cancels == 1
    assert polling.clock.getDelayedCalls() == []


# -- llama.cpp: /health, /props and /slots, and a loading server ---------------------------------

LOADING = b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'


def started(engine: str) -> Iterator[LoadPolling]:
    """A fixture's body: a started :class:`LoadPolling` of ``engine``, stopped after."""
    harness = LoadPolling(engine)
    harness.service.startService()
    yield harness
    if harness.service.running:
        harness.service.stopService()


@pytest.fixture
def llama() -> Iterator[LoadPolling]:
    yield from started("llamacpp")


def models(*names: str) -> bytes:
    return json.dumps({"object": "list", "data": [{"id": n} for n in names]}).encode()


def slots(*busy: bool) -> bytes:
    return json.dumps([{"id": i, "is_processing": b} for i, b in enumerate(busy)]).encode()


#: ``/props`` of an awake server (trimmed).
AWAKE = b'{"total_slots":2,"model_alias":"tiny","is_sleeping":false}'


def serve_round(llama: LoadPolling, node: str, ready: bool) -> None:
    if ready:
        llama.answer(node, "/v1/models", models("tiny"))
        llama.answer(node, "/health", b'{"status":"ok"}')
        llama.answer(node, "/props", AWAKE)
        # Asked once /props said the server is awake (docs/fleet-scheduling.md#sleeping-servers).
        llama.answer(node, "/slots", slots(True, False))
    else:
        for path in ("/v1/models", "/health", "/props"):
            llama.answer(node, path, LOADING, 503)


def test_llamacpp_slots_and_health_are_read(llama: LoadPolling) -> None:
    serve_round(llama, "a", ready=True)
    assert llama.load("a") == LoadState(warm_all=True, slots=2, busy=1)


def test_a_loading_server_stays_in_discovery_with_its_last_models(llama: LoadPolling) -> None:
    """A llama-server restarting answers 503 everywhere while it loads: it is no gone node."""
    serve_round(llama, "a", ready=True)
    llama.clock.advance(INTERVAL)
    serve_round(llama, "a", ready=False)
    assert llama.nodes() == {"a": ("tiny",)} and llama.load("a").loading
    llama.clock.advance(INTERVAL)
    serve_round(llama, "a", ready=True)
    assert llama.nodes() == {"a": ("tiny",)} and not llama.load("a").loading


def test_a_node_that_comes_back_loading_rejoins_as_loading(llama: LoadPolling) -> None:
    serve_round(llama, "a", ready=True)
    llama.clock.advance(INTERVAL)
    # /slots last: asked once /health and /props have said nothing against it.
    for path in ("/v1/models", "/health", "/props", "/slots"):
        for deferred in llama.pending("a", path):
            deferred.errback(ConnectionRefusedError())
    assert llama.nodes() == {}
    llama.clock.advance(INTERVAL)
    serve_round(llama, "a", ready=False)
    assert llama.nodes() == {"a": ("tiny",)} and llama.load("a").loading


def test_a_node_never_seen_does_not_join_while_loading(llama: LoadPolling) -> None:
    serve_round(llama, "b", ready=False)
    assert llama.nodes() == {}


def test_a_failing_model_list_without_loading_still_leaves(llama: LoadPolling) -> None:
    serve_round(llama, "a", ready=True)
    llama.clock.advance(INTERVAL)
    llama.answer("a", "/v1/models", b"{}", 500)
    assert llama.nodes() == {"a": ("tiny",)}  # decided once the load answers are in
    llama.answer("a", "/health", b'{"status":"ok"}')
    llama.answer("a", "/props", AWAKE)
    llama.answer("a", "/slots", slots(False))
    assert llama.nodes() == {}


def test_a_sleeping_server_is_never_asked_its_slots(llama: LoadPolling) -> None:
    """docs/fleet-scheduling.md#sleeping-servers: its ``/props`` says it sleeps, and a
    ``/slots`` request would wake it; it stays in discovery, cold."""
    for _ in range(3):
        llama.answer("a", "/v1/models", models("tiny"))
        llama.answer("a", "/health", b'{"status":"ok"}')
        llama.answer("a", "/props", b'{"total_slots":2,"is_sleeping":true}')
        llama.clock.advance(INTERVAL)
    assert llama.sent("a", "/slots") == []
    assert llama.nodes() == {"a": ("tiny",)}
    assert llama.load("a") == LoadState(warm=frozenset(), sleeping=True)


# -- against simulated engines on loopback -------------------------------------------------------


@pytest.fixture
def pool() -> Iterator[Upstream]:
    client = Upstream(reactor, DIAL)
    yield client
    pytest_twisted.blockon(client.close())


@pytest_twisted.ensureDeferred
async def test_real_sims_report_what_they_hold(pool: Upstream) -> None:
    """An Ollama sim started cold, one warm, a LM Studio sim and a loading llama.cpp sim."""
    cold = SimEngine(reactor, "ollama", models=["llama3:latest"], node="cold", warm=())
    warm = SimEngine(reactor, "ollama", models=["llama3:latest"], node="warm")
    studio = SimEngine(reactor, "lmstudio", models=["a/m1", "a/m2"], node="s", warm=["a/m2"])
    loading = SimEngine(reactor, "llamacpp", models=["tiny"], node="l", load_delay=60, warm=())
    sims = [cold, warm, studio, loading]
    for sim in sims:
        sim.listen()
    nodes = tuple(FleetNode(s.node, {s.dialect: s.url}) for s in sims)
    facades = {e: FacadeSpec(0, ()) for e in ("ollama", "lmstudio", "llamacpp")}
    control = ControlState()
    scheduler = FleetScheduler(Clock(), POLICY)
    service = FleetService(
        Clock(),
        Fleet(INTERVAL, facades, nodes),
        control,
        Facades(),
        pool,
        DIAL,
        scheduler,
    )
    service.startService()
    try:
        await discovery_update(control, lambda m: "warm" in m and "cold" in m)
        # Every node's load answer read, whichever comes last on a busy machine.
        for _ in range(200):
            if (
                scheduler.load("llamacpp", "l").loading
                and scheduler.load("lmstudio", "s").warm
                and scheduler.load("ollama", "warm").warm
                and scheduler.load("ollama", "cold").warm is not None
            ):
                break
            await _turn()
        assert scheduler.load("ollama", "cold").warm == frozenset()
        assert scheduler.load("ollama", "warm").warm == frozenset(
            {"registry.ollama.ai/library/llama3:latest"}
        )
        assert scheduler.load("lmstudio", "s").warm == frozenset({"a/m2"})
        assert scheduler.load("llamacpp", "l").loading
        assert "l" not in {n.id for n in control.discovery("llamacpp").nodes}
    finally:
        service.stopService()
        for sim in sims:
            await sim.stop()


async def _turn() -> None:
    from twisted.internet import task

    await task.deferLater(reactor, 0.05, lambda: None)


# -- what a poll can speak for (docs/fleet-scheduling.md#dispatched-is-loading) -------------------

LLAMA3 = "registry.ollama.ai/library/llama3:latest"


def test_a_poll_asked_before_a_dispatch_does_not_erase_it(polling: LoadPolling) -> None:
    """The poll is asked, a request for llama3 goes to ``a``, then the poll's answer (without
    llama3) arrives: it is older than the dispatch, so llama3 still counts as in memory there.
    The next poll, asked after the dispatch, has the last word."""
    polling.answer("a", "/api/tags", tags("llama3:latest"))
    polling.clock.advance(2.0)
    polling.scheduler.dispatched("ollama", "a", LLAMA3)
    polling.answer("a", "/api/ps", ps())
    assert polling.load("a").warm == frozenset()
    assert polling.scheduler.standing("ollama", "a").load.warm == frozenset({LLAMA3})
    polling.clock.advance(INTERVAL - 2.0)
    polling.answer("a", "/api/tags", tags("llama3:latest"))
    polling.answer("a", "/api/ps", ps())
    assert polling.scheduler.standing("ollama", "a").load.warm == frozenset()


def test_a_poll_that_lists_the_model_confirms_it(polling: LoadPolling) -> None:
    polling.answer("a", "/api/tags", tags("llama3:latest"))
    polling.answer("a", "/api/ps", ps())
    polling.scheduler.dispatched("ollama", "a", LLAMA3)
    polling.clock.advance(INTERVAL)
    polling.answer("a", "/api/tags", tags("llama3:latest"))
    polling.answer("a", "/api/ps", ps("llama3:latest"))
    assert polling.scheduler.standing("ollama", "a").load.warm == frozenset({LLAMA3})
