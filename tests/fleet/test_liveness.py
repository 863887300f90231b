# -*- test-case-name: tests.fleet.test_liveness -*-
"""Hung nodes (:mod:`nvpair.fleet.liveness`; docs/fleet-scheduling.md#hung-nodes): the verdict as a
pure value, the probes on a Clock (every 2 s, bounded at 2 s, the engine's cheapest route), and
what the fleet does with a hung node — out of discovery, last in the order before that, named
when nobody serves its model, shown ``hung`` in ``/status`` and not up in ``nvpair_node_up`` —
without a reactor."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs

from nvpair.control.state import ControlState
from nvpair.engines.table import ENGINES
from nvpair.fleet.file import FacadeSpec, Fleet, FleetNode
from nvpair.fleet.health import HealthPolicy
from nvpair.fleet.liveness import (
    ALIVE,
    PROBE_BOUND,
    PROBE_INTERVAL,
    Liveness,
    LivenessProbes,
    Probe,
)
from nvpair.fleet.polls import FleetService
from nvpair.fleet.scheduling import FleetScheduler
from nvpair.observe.status import FleetView, fleet_nodes, fleet_nodes_up
from tests.fakes import Call, Response, ScriptedUpstream

# -- the verdict, pure ------------------------------------------------------------------------


def run(probes: Sequence[Probe]) -> Liveness:
    """The verdict after ``probes``, the i-th ending at clock time i."""
    liveness = ALIVE
    for when, probe in enumerate(probes):
        liveness = liveness.after(probe, float(when))
    return liveness


def test_two_silent_probes_in_a_row_make_a_node_hung() -> None:
    """The first silence makes the node suspect, the second hung, at the second's end."""
    once = ALIVE.after(Probe.SILENT, 2.0)
    assert once == Liveness(1, None) and once.suspect and not once.hung
    twice = once.after(Probe.SILENT, 4.0)
    assert twice == Liveness(2, 4.0) and twice.hung
    # A third changes nothing but the count: hung since the second.
    assert twice.after(Probe.SILENT, 6.0) == Liveness(3, 4.0)


@pytest.mark.parametrize("probe", [Probe.ANSWERED, Probe.FAILED])
def test_an_answer_or_a_refusal_ends_a_hang_and_a_streak(probe: Probe) -> None:
    """Any answer proves the engine runs; a refused or reset probe is a node down, which its
    poll says: neither is a hang, and a silence before either does not count toward one."""
    assert run([Probe.SILENT, Probe.SILENT, probe]) == ALIVE
    assert run([Probe.SILENT, probe, Probe.SILENT]) == Liveness(1, None)


@given(st.lists(st.sampled_from(list(Probe)), max_size=30))
def test_hung_exactly_when_the_last_two_or_more_probes_were_silent(probes: list[Probe]) -> None:
    """Over any sequence: hung iff the trailing run of silent probes is at least two long,
    since the end of that run's second probe; suspect iff the last probe was silent."""
    liveness = run(probes)
    trailing = len(probes) - next(
        (i + 1 for i in reversed(range(len(probes))) if probes[i] is not Probe.SILENT), 0
    )
    assert liveness.silent == trailing
    assert liveness.hung is (trailing >= 2)
    assert liveness.suspect is (trailing >= 1)
    if liveness.hung:
        assert liveness.hung_since == float(len(probes) - trailing + 1)


# -- the probes, on a Clock -------------------------------------------------------------------


def silent(clock: Clock, probes: int) -> None:
    """Let ``probes`` probes go unanswered, one bound at a time (one ``advance`` past several
    bounds would run only the first: the next probe starts at the new time)."""
    for _ in range(probes):
        clock.advance(PROBE_BOUND)


class Probing:
    """:class:`LivenessProbes` on a Clock over a scripted upstream."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.upstream = ScriptedUpstream()
        self.probes = LivenessProbes(self.clock, self.upstream)
        self.changes: list[tuple[str, str, bool]] = []
        self.probes.changed = lambda engine, node: self.changes.append(
            (engine, node, self.probes.hung(engine, node))
        )

    def sent(self) -> list[Call]:
        return list(self.upstream.calls)

    def last(self) -> Call:
        return self.upstream.calls[-1]


@pytest.mark.parametrize(
    ("engine", "path"), [("ollama", b"/"), ("lmstudio", b"/v1/models"), ("llamacpp", b"/health")]
)
def test_each_engine_is_asked_its_cheapest_route_at_once(engine: str, path: bytes) -> None:
    """Ollama ``GET /``, LM Studio ``GET /v1/models``, llama.cpp ``GET /health``, from the
    moment the node is watched."""
    rig = Probing()
    rig.probes.watch(engine, "a", "http://a:1")
    [call] = rig.sent()
    assert (call.base, call.method, call.uri, call.body) == ("http://a:1", b"GET", path, None)


def test_an_answered_probe_is_repeated_every_two_seconds_from_its_start() -> None:
    """Every 2 s from the previous start, however long the answer took within its bound; its
    body is read and dropped so the connection goes back to the pool."""
    rig = Probing()
    rig.probes.watch("llamacpp", "a", "http://a")
    rig.clock.advance(1.5)
    response = rig.last().answer(Response(503, b'{"error":"Loading model"}'))
    assert response.connection.state == "producing"
    rig.clock.advance(0.49)
    assert len(rig.sent()) == 1
    rig.clock.advance(0.01)
    assert len(rig.sent()) == 2
    assert rig.probes.of("llamacpp", "a") == ALIVE and rig.changes == []


def test_two_probes_without_an_answer_make_the_node_hung_at_four_seconds() -> None:
    """A probe unanswered at 2 s is closed (its request cancelled) and the next sent at once;
    that one unanswered at 4 s makes the node hung, said once, with the reason."""
    rig = Probing()
    rig.probes.watch("llamacpp", "a", "http://a")
    first = rig.last()
    rig.clock.advance(PROBE_BOUND)
    assert first.cancelled and len(rig.sent()) == 2
    assert rig.probes.of("llamacpp", "a").suspect and rig.changes == []
    with capturedLogs() as events:
        rig.clock.advance(PROBE_BOUND - 0.001)
        assert rig.changes == []
        rig.clock.advance(0.001)
    assert rig.sent()[1].cancelled
    assert rig.changes == [("llamacpp", "a", True)]
    assert rig.probes.of("llamacpp", "a").hung_since == 4.0
    why = "no answer to 2 liveness probes in a row (GET /health, 2s each)"
    assert rig.probes.why("llamacpp", "a") == why
    [warned] = [e for e in events if e["log_level"] is LogLevel.warn]
    assert warned["node"] == "a" and warned["why"] == why
    # Still probed: the third goes out at once, and a silence more changes nothing.
    rig.clock.advance(PROBE_BOUND)
    assert len(rig.sent()) == 4 and rig.changes == [("llamacpp", "a", True)]


def test_a_hung_node_comes_back_with_its_first_answered_probe() -> None:
    rig = Probing()
    rig.probes.watch("ollama", "a", "http://a")
    silent(rig.clock, 2)
    assert rig.probes.hung("ollama", "a")
    rig.clock.advance(0.5)
    rig.last().answer(Response(200, b"Ollama is running"))
    assert rig.changes == [("ollama", "a", True), ("ollama", "a", False)]
    assert rig.probes.of("ollama", "a") == ALIVE and rig.probes.why("ollama", "a") is None
    # And the schedule goes on from that probe's start.
    rig.clock.advance(PROBE_INTERVAL - 0.5)
    assert len(rig.sent()) == 4


def test_a_refused_probe_is_no_hang() -> None:
    """A refused connection is a node down: the probes do not call it hung, however long it
    lasts, and a refusal ends a hang (the poll says down)."""
    rig = Probing()
    rig.probes.watch("ollama", "a", "http://a")
    for _ in range(5):
        rig.last().refuse()
        rig.clock.advance(PROBE_INTERVAL)
    assert len(rig.sent()) == 6 and rig.probes.of("ollama", "a") == ALIVE
    silent(rig.clock, 2)
    assert rig.probes.hung("ollama", "a")
    rig.last().refuse()
    assert not rig.probes.hung("ollama", "a")


def test_a_forgotten_node_is_probed_no_more_and_its_probe_out_is_closed() -> None:
    rig = Probing()
    rig.probes.watch("ollama", "a", "http://a")
    rig.clock.advance(PROBE_BOUND)
    out = rig.last()
    rig.probes.forget("ollama", "a")
    assert out.cancelled
    rig.clock.advance(60)
    assert len(rig.sent()) == 2 and rig.changes == []
    assert rig.probes.of("ollama", "a") == ALIVE


def test_watching_again_starts_afresh_at_the_new_url() -> None:
    """A reload that moves a node: the old URL's probe is closed, its silence forgotten."""
    rig = Probing()
    rig.probes.watch("ollama", "a", "http://old")
    rig.clock.advance(PROBE_BOUND)
    old = rig.last()
    rig.probes.watch("ollama", "a", "http://new")
    assert old.cancelled and rig.last().base == "http://new"
    assert rig.probes.of("ollama", "a") == ALIVE


def test_stop_closes_every_probe() -> None:
    rig = Probing()
    rig.probes.watch("ollama", "a", "http://a")
    rig.probes.watch("llamacpp", "b", "http://b")
    rig.probes.stop()
    assert all(call.cancelled for call in rig.sent())
    rig.clock.advance(60)
    assert len(rig.sent()) == 2


# -- the fleet with a hung node ---------------------------------------------------------------


class Facades:
    def enable(
        self, engine_id: str, port: int | None, aliases: Sequence[str], ignore: bool
    ) -> object:
        return {}


#: The model every node of :class:`HungFleet` serves, as Ollama compares names.
KEY = ENGINES["ollama"].model_key("m")


def tags(*names: str) -> bytes:
    return json.dumps({"models": [{"name": n} for n in names]}).encode()


class HungFleet:
    """A FleetService with probes and a scheduler on a Clock, Ollama nodes ``a`` and ``b``
    serving ``m``; every request scripted, polls answered by the test."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.upstream = ScriptedUpstream()
        self.control = ControlState()
        self.probes = LivenessProbes(self.clock, self.upstream)
        self.scheduler = FleetScheduler(
            self.clock, HealthPolicy(3, 5.0, 60.0), liveness=self.probes
        )
        nodes = (FleetNode("a", {"ollama": "http://a"}), FleetNode("b", {"ollama": "http://b"}))
        self.fleet = FleetService(
            self.clock,
            Fleet(60.0, {"ollama": FacadeSpec(0, ())}, nodes),
            self.control,
            Facades(),
            self.upstream,
            10.0,
            self.scheduler,
            liveness=self.probes,
        )
        self.fleet.startService()
        for call in self.open(b"/api/tags"):
            call.answer(Response(200, tags("m")))

    def open(self, uri: bytes, base: str | None = None) -> list[Call]:
        return [
            c for c in self.upstream.open() if c.uri == uri and (base is None or c.base == base)
        ]

    def answer_probes(self, *bases: str) -> None:
        for base in bases:
            for call in self.open(b"/", base):
                call.answer(Response(200, b"Ollama is running"))

    def discovered(self) -> list[str]:
        return [node.id for node in self.control.discovery("ollama").nodes]

    def view(self) -> FleetView:
        return FleetView(self.fleet.reports, lambda: self.fleet.polled, self.scheduler)


def test_a_hung_node_leaves_discovery_and_comes_back_with_its_first_answer() -> None:
    """Its poll has said nothing yet (it waits on its own 40 s bound): the probes take it out
    of discovery — which abandons an attempt there not yet committed, as for any node that
    leaves — and put it back with their first answer."""
    rig = HungFleet()
    assert rig.discovered() == ["a", "b"]
    snapshots: list[list[str]] = []
    rig.control.on_discovery(
        lambda engine, snapshot: snapshots.append([n.id for n in snapshot.nodes])
    )
    for _ in range(2):
        rig.answer_probes("http://b")
        rig.clock.advance(PROBE_INTERVAL)
    assert snapshots[-1] == ["b"] and rig.discovered() == ["b"]
    assert rig.scheduler.owners_down("ollama", KEY) == ["a (hung)"]
    rig.answer_probes("http://a", "http://b")
    assert rig.discovered() == ["a", "b"]
    assert rig.scheduler.owners_down("ollama", KEY) == []


def test_a_node_whose_last_probe_went_unanswered_goes_last() -> None:
    """One silence: still in discovery, but after every other owner, as a held-back node."""
    rig = HungFleet()
    rig.answer_probes("http://b")
    rig.clock.advance(PROBE_INTERVAL)
    assert rig.discovered() == ["a", "b"]
    nodes = rig.control.discovery("ollama").nodes
    plan = rig.scheduler.plan("ollama", nodes, None, KEY, {})
    assert [node.id for node in plan.candidates] == ["b", "a"]


def test_a_hung_node_reads_hung_with_why_and_is_not_up() -> None:
    """``/status``: state ``hung``, why, since when; ``nvpair_node_up`` 0 for it."""
    rig = HungFleet()
    for _ in range(2):
        rig.answer_probes("http://b")
        rig.clock.advance(PROBE_INTERVAL)
    rig.clock.advance(1.0)
    now = rig.clock.seconds()
    nodes = {
        n["id"]: n
        for n in fleet_nodes(
            "ollama", rig.fleet.reports()["ollama"], rig.view(), now, {}, lambda e, n: 0
        )
    }
    hung = nodes["a"]
    assert hung["state"] == "hung"
    assert hung["why"] == "no answer to 2 liveness probes in a row (GET /, 2s each)"
    assert nodes["b"]["state"] == "up" and nodes["b"]["why"] is None
    assert fleet_nodes_up(rig.view(), now) == {("ollama", "a"): False, ("ollama", "b"): True}


def test_a_reload_probes_a_moved_node_afresh_and_a_removed_one_no_more() -> None:
    """SIGHUP: ``a`` removed, ``b`` moved: ``a``'s probe is closed and none follows; ``b``'s
    old one is closed, a new one goes to its new URL, its silence so far forgotten."""
    rig = HungFleet()
    rig.answer_probes("http://b")
    rig.clock.advance(PROBE_INTERVAL)
    old_a, old_b = rig.open(b"/", "http://a"), rig.open(b"/", "http://b")
    assert rig.probes.of("ollama", "a").suspect
    rig.fleet.reload(
        Fleet(60.0, {"ollama": FacadeSpec(0, ())}, (FleetNode("b", {"ollama": "http://b2"}),))
    )
    assert all(call.cancelled for call in old_a + old_b)
    assert [call.base for call in rig.open(b"/")] == ["http://b2"]
    rig.clock.advance(5 * PROBE_INTERVAL)
    assert {call.base for call in rig.upstream.calls if call.uri == b"/"} == {
        "http://a",
        "http://b",
        "http://b2",
    }
    assert rig.probes.of("ollama", "a") == ALIVE
