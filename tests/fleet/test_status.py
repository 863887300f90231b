# -*- test-case-name: tests.fleet.test_status -*-
"""The admin documents as pure values (:mod:`nvpair.observe.status`): ``/status`` in both modes and
``/readyz``."""

from __future__ import annotations

import json

import pytest
from twisted.internet.task import Clock

from nvpair.control.affinity import ROUTED_WINDOW
from nvpair.control.state import ControlState, Node, PriorityEntry
from nvpair.engines.conversation import prefix_keys
from nvpair.engines.inferstats import Stats
from nvpair.engines.loadstate import LoadState
from nvpair.fleet.health import HealthPolicy
from nvpair.fleet.pairs import PairReport, PollState
from nvpair.fleet.scheduling import FleetScheduler
from nvpair.observe.status import (
    FacadeView,
    FleetView,
    fleet_nodes_up,
    readiness,
    shown_url,
    status_document,
)

OLLAMA = {"ollama": FacadeView(11435, ("127.0.0.2:11434",), False)}


def node(node_id: str, *models: str) -> Node:
    return Node(node_id, False, f"http://{node_id}", models, frozenset(models))


def flight(engine: str, node_id: str) -> int:
    return {("ollama", "a"): 2}.get((engine, node_id), 0)


def test_broker_status_shows_the_schedulers_figures_per_node() -> None:
    control = ControlState()
    control.set_discovery("ollama", [node("a", "llama3"), node("b", "qwen")])
    control.set_priority(3, [PriorityEntry("a", 1.5, 0.25)])
    control.set_pin("ollama", "b")
    doc = status_document(OLLAMA, control, {"a": 1, "b": 0}, flight, 2, None, 0.0)
    assert doc["mode"] == "broker"
    assert doc["facades"] == {
        "ollama": {"port": 11435, "aliases": ["127.0.0.2:11434"], "tls": False}
    }
    assert doc["pin"] == {"ollama": "b"} and doc["priorityGeneration"] == 3
    assert doc["inFlight"] == 2 and doc["reservations"] == {"a": 1}
    a, b = doc["nodes"]["ollama"]  # type: ignore[index]
    assert a == {
        "id": "a",
        "local": False,
        "url": "http://a",
        "models": ["llama3"],
        "listed": True,
        "pending": 1.5,
        "gpuPressure": 0.25,
        "reservations": 1,
        "inFlight": 2,
    }
    assert b["listed"] is False and b["pending"] == 0 and b["inFlight"] == 0
    json.dumps(doc, allow_nan=False)


def test_before_any_priority_every_node_counts_as_listed() -> None:
    control = ControlState()
    control.set_discovery("ollama", [node("a", "llama3")])
    doc = status_document(OLLAMA, control, {}, flight, 0, None, 0.0)
    assert doc["nodes"]["ollama"][0]["listed"] is True  # type: ignore[index]


def test_a_url_is_shown_without_its_user_name_and_password() -> None:
    """A broker may hand over a URL with credentials: /status shows it without them."""
    control = ControlState()
    secret = Node("a", False, "http://admin:s3cret@10.0.0.2:8080/v1?k=@", (), frozenset())
    control.set_discovery("ollama", [secret])
    doc = status_document(OLLAMA, control, {}, flight, 0, None, 0.0)
    assert doc["nodes"]["ollama"][0]["url"] == "http://***@10.0.0.2:8080/v1?k=@"  # type: ignore[index]
    assert "s3cret" not in json.dumps(doc)


@pytest.mark.parametrize(
    "url", ["http://h:1/p@q", "http://[::1", "x@y", "http://h:1", "https://[::1]:8/"]
)
def test_a_url_without_credentials_is_shown_as_it_is(url: str) -> None:
    assert shown_url(url) == url


REFUSED = "ConnectionRefusedError"


class Fleetish:
    def __init__(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.scheduler = FleetScheduler(self.clock, HealthPolicy(2, 5.0, 60.0))
        now = self.clock.seconds()
        self.reports: dict[str, tuple[PairReport, ...]] = {
            "ollama": (
                PairReport("a", "ollama", "http://a", PollState.UP, ("llama3",), now, None, now),
                PairReport(
                    "b",
                    "ollama",
                    "http://b:1",
                    PollState.DOWN,
                    (),
                    now,
                    "ConnectionRefusedError",
                    now,
                ),
                PairReport("c", "ollama", "http://c", PollState.UP, ("llama3",), now, None, now),
                PairReport("d", "ollama", "http://d", PollState.PENDING),
            )
        }
        self.view = FleetView(lambda: self.reports, lambda: False, self.scheduler)


def test_fleet_status_shows_every_configured_node_with_its_state_and_why() -> None:
    fleet = Fleetish()
    control = ControlState()
    fleet.scheduler.record_load("ollama", "a", LoadState(warm=frozenset({"llama3"})))
    for _ in range(2):
        fleet.scheduler.health.failed("ollama", "c", False, "status 500")
    doc = status_document(OLLAMA, control, {"a": 1}, flight, 2, fleet.view, fleet.clock.seconds())
    assert doc["mode"] == "fleet"
    a, b, c, d = doc["nodes"]["ollama"]  # type: ignore[index]
    assert (a["id"], a["state"], a["why"]) == ("a", "up", None)
    assert a["load"] == {
        "loading": False,
        "inMemory": ["llama3"],
        "slots": None,
        "busySlots": 0,
        "loadingModels": [],
        "modelSlots": {},
        "sleeping": False,
        "sleepingModels": [],
    }
    assert a["reservations"] == 1 and a["inFlight"] == 2
    assert a["lastPoll"] == "2023-11-14T22:13:20.000+00:00"
    assert (b["state"], b["url"], b["why"], b["lastError"]) == (
        "down",
        "http://b:1",
        "ConnectionRefusedError",
        "ConnectionRefusedError",
    )
    assert b["load"]["inMemory"] is None  # the engine said nothing
    assert c["state"] == "held-back"
    assert c["why"] == "2 failed attempts in a row (last: status 500)"
    assert c["health"] == {
        "failuresInARow": 2,
        "heldUntil": "2023-11-14T22:13:25.000+00:00",
        "lastFailure": "status 500",
    }
    assert (d["state"], d["lastPoll"]) == ("pending", None)
    json.dumps(doc, allow_nan=False)
    # The hold is over: the poll's word stands again.
    fleet.clock.advance(5)
    later = status_document(OLLAMA, control, {}, flight, 0, fleet.view, fleet.clock.seconds())
    assert later["nodes"]["ollama"][2]["state"] == "up"  # type: ignore[index]


def test_fleet_status_shows_each_nodes_cache_share_and_the_affinity_table() -> None:
    """docs/fleet-scheduling.md#what-the-operator-sees"""
    fleet = Fleetish()
    scheduler, now = fleet.scheduler, fleet.clock.seconds()
    keys = prefix_keys({"messages": [{"role": "user", "content": "hi"}]})
    scheduler.answered("ollama", "a", "llama3", keys, Stats(100, 1, None, None, False, 75), False)
    scheduler.answered("ollama", "a", "llama3", keys, Stats(100, 1, None, None, False, 0), False)
    for _ in range(ROUTED_WINDOW):
        scheduler.answered("ollama", "c", "llama3", (), Stats(50, 1, None, None, False, 0), True)
    doc = status_document(OLLAMA, ControlState(), {}, flight, 0, fleet.view, now)
    a, b, c, _ = doc["nodes"]["ollama"]  # type: ignore[index]
    assert a["cache"] == {
        "share": 0.375,
        "answers": 2,
        "promptTokens": 200,
        "cachedTokens": 75,
        "suspendedUntil": None,
    }
    assert b["cache"] is None
    assert c["cache"]["share"] == 0.0
    assert c["cache"]["suspendedUntil"] == "2023-11-14T22:23:20.000+00:00"
    assert doc["affinity"] == {"enabled": True, "slack": 2, "entries": 1, "bound": 100_000}
    json.dumps(doc, allow_nan=False)
    assert "affinity" not in status_document(OLLAMA, ControlState(), {}, flight, 0, None, now)


def test_a_node_is_up_while_its_engine_answers_and_it_is_not_held_back() -> None:
    """``nvpair_node_up``: 1 up (a model load included), 0 down, held back or not polled yet;
    a hold that ends makes the node up again."""
    fleet = Fleetish()
    now = fleet.clock.seconds()
    fleet.reports["ollama"] = (
        *fleet.reports["ollama"],
        PairReport("e", "ollama", "http://e", PollState.LOADING, (), now, "status 503", now),
    )
    for _ in range(2):
        fleet.scheduler.health.failed("ollama", "c", False, "status 500")
    assert fleet_nodes_up(fleet.view, now) == {
        ("ollama", "a"): True,
        ("ollama", "b"): False,
        ("ollama", "c"): False,
        ("ollama", "d"): False,
        ("ollama", "e"): True,
    }
    assert fleet_nodes_up(fleet.view, now + 5)[("ollama", "c")] is True


def test_readiness_waits_for_facades_and_control_state() -> None:
    control = ControlState()
    ready, body = readiness(["ollama", "llamacpp"], OLLAMA, False, control)
    assert not ready
    assert body["waitingFor"] == [
        "facade llamacpp not listening",
        "control state not received yet",
    ]
    ready, body = readiness(["ollama"], OLLAMA, True, control)
    # Ready, but the operator is told the engine has no node up.
    assert ready and body == {"ready": True, "waitingFor": [], "enginesWithoutNodes": ["ollama"]}
    control.set_discovery("ollama", [node("a", "llama3")])
    assert readiness(["ollama"], OLLAMA, True, control)[1]["enginesWithoutNodes"] == []


def test_the_openai_facade_has_nodes_when_any_engine_has_one() -> None:
    """It reaches every engine's nodes: named without nodes only while no engine has one, and it
    lists none of its own (docs/openai-facade.md#what-an-operator-sees)."""
    control = ControlState()
    openai = {"openai": FacadeView(4000, (), False)}
    assert readiness(["openai"], openai, True, control)[1]["enginesWithoutNodes"] == ["openai"]
    control.set_discovery("llamacpp", [node("a", "tiny")])
    assert readiness(["openai"], openai, True, control)[1]["enginesWithoutNodes"] == []
    document = status_document(openai, control, {}, lambda engine, node: 0, 0, None, 0.0)
    assert document["nodes"] == {} and document["facades"] == {
        "openai": {"port": 4000, "aliases": [], "tls": False}
    }
