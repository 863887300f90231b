"""bench.soak.client against a simulated engine on loopback (no proxy): each way an exchange can
end is classified as such, and a hang is cut off at the timeout."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor as _reactor
from twisted.internet.task import deferLater
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from bench.soak.client import (
    ANSWERED,
    CLOSED,
    CUT,
    DROPPED,
    GAVE_UP,
    TIMEOUT,
    Clients,
    Outcome,
    send,
)
from bench.soak.plan import Ending, RequestSpec
from nvpair.sim import SimEngine

#: The global reactor, untyped: its listenTCP generic rejects a Site.
reactor: Any = _reactor

_BODY = json.dumps({"model": "tiny", "prompt": "hi", "stream": True}).encode()


def _spec(ending: Ending = Ending.READ, after: float = 0.0, fresh: bool = False) -> RequestSpec:
    return RequestSpec(
        "llamacpp",
        "stream",
        "POST",
        "/completion",
        _BODY,
        (("Content-Type", "application/json"),),
        ending,
        after,
        fresh,
    )


@pytest.fixture
def engine() -> Iterator[SimEngine]:
    sim = SimEngine(reactor, "llamacpp", models=["tiny"], tokens=["a"] * 10, chunk_interval=0.01)
    sim.listen(0)
    yield sim
    sim.stop()


async def _send(sim: SimEngine, spec: RequestSpec, timeout: float = 5.0) -> Outcome:
    clients = Clients(reactor, 4)
    try:
        return await send(reactor, clients, sim.url, spec, timeout)
    finally:
        await clients.close_idle()


@pytest_twisted.ensureDeferred
async def test_whole_stream_is_answered(engine: SimEngine) -> None:
    outcome = await _send(engine, _spec())
    assert (outcome.kind, outcome.status, outcome.reason) == (ANSWERED, 200, None)


@pytest_twisted.ensureDeferred
async def test_engine_dying_mid_stream_is_a_cut(engine: SimEngine) -> None:
    engine.faults.die_after_chunks = 2
    outcome = await _send(engine, _spec())
    assert (outcome.kind, outcome.status) == (CUT, 200)


@pytest_twisted.ensureDeferred
async def test_stall_after_headers_is_a_timeout_not_a_wait(engine: SimEngine) -> None:
    engine.faults.stall = True
    outcome = await _send(engine, _spec(), timeout=0.5)
    assert (outcome.kind, outcome.detail) == (TIMEOUT, "answer started")
    assert outcome.seconds < 2


@pytest_twisted.ensureDeferred
async def test_header_delay_past_the_timeout_is_a_timeout(engine: SimEngine) -> None:
    engine.faults.header_delay = 5
    outcome = await _send(engine, _spec(), timeout=0.5)
    assert (outcome.kind, outcome.detail) == (TIMEOUT, "no status")


@pytest_twisted.ensureDeferred
async def test_close_before_status_is_closed(engine: SimEngine) -> None:
    engine.faults.header_delay = 0.3
    reactor.callLater(0.1, engine.refuse)
    outcome = await _send(engine, _spec(fresh=True))
    assert outcome.kind == CLOSED
    assert outcome.detail.startswith("ResponseNeverReceived")


@pytest_twisted.ensureDeferred
async def test_planned_drop_and_give_up_are_ours(engine: SimEngine) -> None:
    assert (await _send(engine, _spec(Ending.DROP_MID_STREAM))).kind == DROPPED
    engine.faults.header_delay = 2
    assert (await _send(engine, _spec(Ending.GIVE_UP, 0.1))).kind == GAVE_UP
    engine.faults.clear()
    engine.faults.first_byte_delay = 2
    assert (await _send(engine, _spec(Ending.GIVE_UP, 0.2))).kind == GAVE_UP


@pytest_twisted.ensureDeferred
async def test_a_planned_drop_never_leaves_a_closing_connection_in_the_pool() -> None:
    """A body that arrives in one read completes the response, so the pool takes the connection
    back before the drop's close happens; the next pooled request must not be handed it (it
    would fail as 'closed before status' and be blamed on the proxy)."""

    class Whole(Resource):
        isLeaf = True

        def render(self, request: Any) -> int:
            for i in range(5):
                request.write(b"data: %d\n\n" % i)  # one transport write, one read
            request.finish()
            return NOT_DONE_YET

    port = reactor.listenTCP(0, Site(Whole()), interface="127.0.0.1")
    base = f"http://127.0.0.1:{port.getHost().port}"
    clients = Clients(reactor, 4)
    try:
        for _ in range(10):
            drop = RequestSpec("x", "stream", "GET", "/", None, (), Ending.DROP_MID_STREAM)
            assert (await send(reactor, clients, base, drop, 5)).kind == DROPPED
            await deferLater(reactor, 0, lambda: None)
            plain = RequestSpec("x", "stream", "GET", "/", None, ())
            assert (await send(reactor, clients, base, plain, 5)).kind == ANSWERED
    finally:
        await clients.close_idle()
        await port.stopListening()
