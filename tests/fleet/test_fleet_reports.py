# -*- test-case-name: tests.fleet.test_fleet_reports -*-
"""Every configured node is visible, and the fleet file is re-read live (issue 13 items 4
and 6; docs/fleet-scheduling.md): :meth:`FleetService.reports` and the state-change log lines,
:meth:`FleetService.reload` and :func:`nvpair.fleet.file.restart_needed`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs

from nvpair.control.state import ControlState
from nvpair.engines.loadstate import UNKNOWN, LoadState
from nvpair.fleet.file import FacadeSpec, Fleet, FleetNode, restart_needed
from nvpair.fleet.health import HealthPolicy
from nvpair.fleet.pairs import PollState
from nvpair.fleet.polls import FleetService
from nvpair.fleet.scheduling import FleetScheduler
from nvpair.wire.message import Answer, Fields
from tests.fleet.test_fleet_poll import (
    BOUND,
    DIAL,
    INTERVAL,
    AgentClient,
    Facades,
    ScriptedAgent,
    fleet,
    members,
    tags,
)
from tests.wire.client.test_bodies import FakeResponse


class LoadAgent(ScriptedAgent):
    """Load polls (``/api/ps``) answered at once with nothing in memory, or (``hang``) never,
    failing with CancelledError when cancelled as our own upstream client does; the model
    lists are the test's to answer."""

    def __init__(self, hang: bool = False) -> None:
        super().__init__()
        self.hang = hang
        self.hanging: list[Deferred[Answer]] = []

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Fields | None = None,
        bodyProducer: object = None,
    ) -> Deferred[Answer]:
        if not uri.endswith(b"/api/ps"):
            return super().request(method, uri, headers, bodyProducer)
        if not self.hang:
            return succeed(FakeResponse(200, b'{"models": []}'))
        self.hanging.append(d := Deferred[Answer]())
        return d


class Reporting:
    """A FleetService with a scheduler on a Clock, nodes ``a`` and ``b``."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_000)
        self.agent = LoadAgent()
        self.control = ControlState()
        self.scheduler = FleetScheduler(self.clock, HealthPolicy(3, 5.0, 60.0))
        self.service = FleetService(
            self.clock,
            fleet(("a", "http://a"), ("b", "http://b")),
            self.control,
            Facades(),
            AgentClient(self.agent),
            DIAL,
            self.scheduler,
        )

    def report(self, node: str) -> Any:
        (found,) = [r for r in self.service.reports()["ollama"] if r.node == node]
        return found


@pytest.fixture
def rig() -> Iterator[Reporting]:
    harness = Reporting()
    harness.service.startService()
    yield harness
    if harness.service.running:
        harness.service.stopService()


def lines(events: Sequence[dict[str, Any]], node: str) -> list[tuple[LogLevel, str]]:
    return [(e["log_level"], e["log_format"]) for e in events if e.get("node") == node]


def refuse(rig: Reporting, node: str) -> None:
    rig.agent.last(node).deferred.errback(ConnectionRefusedError("refused"))


def test_every_configured_node_is_reported_before_it_answers(rig: Reporting) -> None:
    reports = rig.service.reports()["ollama"]
    assert [(r.node, r.url, r.state) for r in reports] == [
        ("a", "http://a", PollState.PENDING),
        ("b", "http://b", PollState.PENDING),
    ]
    assert not rig.service.polled


def test_a_node_that_never_answers_is_down_with_why_and_logged_at_once(rig: Reporting) -> None:
    """The new user's wrong port: visible, with the reason, at its first failed poll."""
    with capturedLogs() as events:
        refuse(rig, "a")
    report = rig.report("a")
    assert report.state is PollState.DOWN
    assert report.last_poll == 1_000 and report.since == 1_000
    assert report.last_error is not None and "refused" in report.last_error
    assert lines(events, "a") == [
        (LogLevel.warn, "{node}'s {engine} at {url} does not answer its poll: {why}")
    ]
    (warned,) = [e for e in events if e.get("node") == "a"]
    assert warned["url"] == "http://a" and "refused" in warned["why"]
    assert "a" not in members(rig.control)


def test_down_again_is_not_logged_again_but_the_report_moves_on(rig: Reporting) -> None:
    refuse(rig, "a")
    rig.clock.advance(INTERVAL)
    with capturedLogs() as events:
        rig.agent.answer("a", b"{}", 500)
    assert lines(events, "a") == []
    report = rig.report("a")
    assert report.state is PollState.DOWN and report.last_error == "status 500"
    assert report.last_poll == 1_000 + INTERVAL and report.since == 1_000


def test_up_down_up_is_logged_warn_then_info(rig: Reporting) -> None:
    with capturedLogs() as events:
        rig.agent.answer("a", tags("m1"))
        rig.clock.advance(INTERVAL)
        refuse(rig, "a")
        rig.clock.advance(INTERVAL)
        rig.agent.answer("a", tags("m1"))
    assert lines(events, "a") == [
        (LogLevel.info, "{node} joined {engine} discovery with {count} models"),
        (LogLevel.warn, "{node} left {engine} discovery: poll of {url} failed ({why})"),
        (LogLevel.info, "{node}'s {engine} answers again: back in discovery with {count} models"),
    ]
    report = rig.report("a")
    assert report.state is PollState.UP and report.last_error is None
    assert report.models == ("m1",)


def test_polled_once_every_pair_has_an_answer_or_a_failure(rig: Reporting) -> None:
    def polled() -> bool:
        return rig.service.polled

    rig.agent.answer("a", tags("m1"))
    assert not polled()
    rig.clock.advance(BOUND)  # b's poll hits its bound: a failure, but polled
    assert polled()
    assert rig.report("b").state is PollState.DOWN


# -- reload (SIGHUP) ------------------------------------------------------------------------


def nodes(*pairs: tuple[str, str]) -> tuple[FleetNode, ...]:
    return tuple(FleetNode(node, {"ollama": url}) for node, url in pairs)


def reread(*pairs: tuple[str, str], interval: float = INTERVAL, port: int = 0) -> Fleet:
    return Fleet(interval, {"ollama": FacadeSpec(port, ())}, nodes(*pairs))


def joined(rig: Reporting) -> None:
    rig.agent.answer("a", tags("m1"))
    rig.agent.answer("b", tags("m2"))
    assert members(rig.control) == {"a": ("m1",), "b": ("m2",)}


def test_reload_adds_a_node_and_polls_it_at_once(rig: Reporting) -> None:
    joined(rig)
    rig.service.reload(reread(("a", "http://a"), ("b", "http://b"), ("c", "http://c")))
    assert len(rig.agent.polls("c")) == 1
    # The others keep their schedule: no extra poll.
    assert len(rig.agent.polls("a")) == 1
    # Ready stays ready: the first round was done before, and /readyz must not turn 503 on
    # a reload while the new node's first poll is out.
    assert rig.service.polled
    rig.agent.answer("c", tags("m3"))
    assert members(rig.control)["c"] == ("m3",)
    assert [r.node for r in rig.service.reports()["ollama"]] == ["a", "b", "c"]


def test_reload_removes_a_node_and_its_late_answer_is_dropped(rig: Reporting) -> None:
    joined(rig)
    rig.clock.advance(INTERVAL)
    late = rig.agent.last("b")
    with capturedLogs() as events:
        rig.service.reload(reread(("a", "http://a")))
    assert members(rig.control) == {"a": ("m1",)}
    assert late.cancels == 1  # its poll in flight closed
    assert [r.node for r in rig.service.reports()["ollama"]] == ["a"]
    assert lines(events, "b") == [
        (LogLevel.info, "{node} removed from the fleet file: left {engine} discovery")
    ]
    rig.clock.advance(INTERVAL * 3)
    assert len(rig.agent.polls("b")) == 2  # never polled again


def test_reload_moves_a_node_without_it_leaving_discovery(rig: Reporting) -> None:
    joined(rig)
    seen: list[set[str]] = []
    rig.control.on_discovery(lambda engine, snap: seen.append({n.id for n in snap.nodes}))
    rig.service.reload(reread(("a", "http://a"), ("b", "http://b2")))
    # b is still an owner, now dialled at its new URL: a request in flight to b is not
    # abandoned, a new one goes to the new place.
    assert all("b" in ids for ids in seen)
    assert rig.control.discovery("ollama").node("b").url == "http://b2"  # type: ignore[union-attr]
    assert len(rig.agent.sent.get("http://b2/api/tags", [])) == 1
    rig.agent.sent["http://b2/api/tags"][-1].deferred.errback(ConnectionError("refused"))
    assert "b" not in members(rig.control)


def test_reload_forgets_a_moved_nodes_health_and_load(rig: Reporting) -> None:
    joined(rig)
    for _ in range(3):
        rig.scheduler.health.failed("ollama", "b", False, "status 500")
    rig.scheduler.record_load("ollama", "b", LoadState(warm=frozenset({"m2"})))
    assert rig.scheduler.health.held("ollama", "b")
    # The new URL's load poll is left unanswered: what is known of b then is what the reload
    # left, which must not be the old URL's.
    rig.agent.hang = True
    rig.service.reload(reread(("a", "http://a"), ("b", "http://b2")))
    assert not rig.scheduler.health.held("ollama", "b")
    assert rig.scheduler.load("ollama", "b") == UNKNOWN
    rig.agent.hang = False
    # An unchanged node keeps what was learned.
    rig.scheduler.record_load("ollama", "a", LoadState(warm=frozenset({"m1"})))
    rig.service.reload(reread(("a", "http://a"), ("b", "http://b2")))
    assert rig.scheduler.load("ollama", "a").warm == frozenset({"m1"})


def test_reload_changes_the_interval_without_a_double_poll(rig: Reporting) -> None:
    joined(rig)
    rig.service.reload(reread(("a", "http://a"), ("b", "http://b"), interval=1.0))
    assert len(rig.agent.polls("a")) == 1
    rig.clock.advance(1.0)
    assert len(rig.agent.polls("a")) == 2
    # a's poll is out and unanswered: the next tick does not start a second one.
    rig.clock.advance(1.0)
    assert len(rig.agent.polls("a")) == 2
    rig.agent.answer("a", tags("m1"))
    rig.clock.advance(1.0)
    assert len(rig.agent.polls("a")) == 3


def test_reload_logs_a_port_change_as_needing_a_restart_and_keeps_the_facade(
    rig: Reporting,
) -> None:
    joined(rig)
    with capturedLogs() as events:
        rig.service.reload(reread(("a", "http://a"), ("b", "http://b"), port=11500))
    assert [(e["log_level"], e.get("change")) for e in events if "change" in e] == [
        (LogLevel.warn, "facades.ollama.port 0 -> 11500")
    ]
    # Nothing else changed: discovery untouched.
    assert members(rig.control) == {"a": ("m1",), "b": ("m2",)}


def test_restart_needed_names_each_change() -> None:
    running = Fleet(
        5.0, {"ollama": FacadeSpec(0, ()), "llamacpp": FacadeSpec(8080, ("127.0.0.2:8080",))}, ()
    )
    same = Fleet(1.0, dict(running.facades), nodes(("x", "http://x")))
    assert restart_needed(running, same) == []
    changed = Fleet(5.0, {"llamacpp": FacadeSpec(8081, ()), "lmstudio": FacadeSpec(0, ())}, ())
    assert restart_needed(running, changed) == [
        "facades.llamacpp.port 8080 -> 8081",
        "facades.llamacpp.aliases changed",
        "facades.lmstudio added",
        "facades.ollama removed",
    ]


def test_a_removed_engine_is_not_polled_but_a_new_one_waits_for_a_restart(
    rig: Reporting,
) -> None:
    joined(rig)
    both = Fleet(
        INTERVAL,
        {"ollama": FacadeSpec(0, ()), "llamacpp": FacadeSpec(0, ())},
        (FleetNode("a", {"ollama": "http://a", "llamacpp": "http://a:8080"}),),
    )
    rig.service.reload(both)
    # No llama.cpp facade runs here: its URL is not polled until a restart enables it.
    assert "http://a:8080/v1/models" not in rig.agent.sent
    assert set(rig.service.reports()) == {"ollama"}


def test_a_load_poll_cancelled_by_a_reload_is_no_error() -> None:
    """Cancelling the gathered load routes fails them with a FirstError around
    CancelledError; the reload has taken the node's pair out first, so that is no bug to log."""

    clock, agent, control = Clock(), LoadAgent(hang=True), ControlState()
    service = FleetService(
        clock,
        fleet(("a", "http://a")),
        control,
        Facades(),
        AgentClient(agent),
        DIAL,
        FleetScheduler(clock, HealthPolicy(3, 5.0, 60.0)),
    )
    service.startService()
    (hanging,) = agent.hanging
    with capturedLogs() as events:
        service.reload(reread())
        assert hanging.called
        service.stopService()
    assert [e for e in events if e["log_level"] >= LogLevel.warn] == []


def test_the_scheduler_hears_while_a_node_is_still_to_answer_its_first_poll(
    rig: Reporting,
) -> None:
    """What a health route with no node answers (docs/fleet-scheduling.md#before-the-first-poll):
    the engine is starting while any node is pending; one that answered is no longer, nor one
    whose poll failed (down is not loading); an engine without nodes never is."""
    assert rig.scheduler.starting("ollama")
    rig.agent.answer("a", tags("llama3:latest"))
    assert rig.scheduler.starting("ollama")
    refuse(rig, "b")
    assert not rig.scheduler.starting("ollama")
    assert not rig.scheduler.starting("llamacpp")
