"""The soak's pure parts (bench.soak): its fleet file, request and fault draws, /proc parsing,
log summary and verdict. The soak itself is a manual run (``make soak``), not a test."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from bench.soak.client import ANSWERED, CLOSED, CUT, TIMEOUT, Outcome
from bench.soak.judge import FD_TOLERANCE, Sample, Tally, fleet_up, judge
from bench.soak.plan import (
    ENGINES,
    FAULT_WEIGHTS,
    NODES,
    Ending,
    draw_fault,
    draw_request,
    fleet_toml,
    node_models,
)
from bench.soak.probe import LogSummary, Sockets, classify_sockets, summarize_log
from nvpair.control.state import ControlState
from nvpair.fleet.file import load_fleet
from nvpair.observe.status import status_document
from tests.fleet.test_status import OLLAMA, Fleetish, flight


def test_fleet_file_loads_with_the_proxys_own_parser(tmp_path: Path) -> None:
    """The generated file is a valid standalone fleet file: every node, every engine."""
    urls = {
        n: {e: f"http://127.0.0.1:{20000 + i * 3 + j}" for j, e in enumerate(ENGINES)}
        for i, n in enumerate(NODES)
    }
    path = tmp_path / "fleet.toml"
    path.write_text(fleet_toml("1s", {"ollama": 1, "lmstudio": 2, "llamacpp": 3}, urls))
    fleet = load_fleet(path)
    assert fleet.inventory_interval == 1.0
    assert {e: s.port for e, s in fleet.facades.items()} == {
        "ollama": 1,
        "lmstudio": 2,
        "llamacpp": 3,
    }
    assert [(n.id, dict(n.engines)) for n in fleet.nodes] == list(urls.items())


def test_every_model_but_the_solo_one_has_two_owners_or_more() -> None:
    """Node-4 alone holds one model per engine; the others survive one node's fault."""
    for engine in ENGINES:
        owners = Counter(m for i in range(len(NODES)) for m in node_models(engine, i))
        assert sorted(owners.values()) == [1, 2, 2, 4]


@given(st.integers(min_value=0, max_value=2**32))
def test_drawn_requests_are_well_formed(seed: int) -> None:
    """Every draw names a known engine; only inference drops or gives up; give-ups have a time."""
    rng = random.Random(seed)
    for _ in range(50):
        spec = draw_request(rng)
        assert spec.engine in ENGINES
        assert spec.path.startswith("/")
        if spec.ending is not Ending.READ:
            assert spec.kind in ("inference", "stream")
        if spec.ending is Ending.DROP_MID_STREAM:
            assert spec.kind == "stream"
        assert (spec.give_up_after > 0) == (spec.ending is Ending.GIVE_UP)
        if spec.kind in ("inference", "stream"):
            assert json.loads(spec.body or b"")["stream"] is (spec.kind == "stream")


@given(st.integers(min_value=0, max_value=2**32))
def test_drawn_faults_are_known_kinds_with_a_bounded_hold(seed: int) -> None:
    fault = draw_fault(random.Random(seed))
    assert fault.kind in FAULT_WEIGHTS
    assert 3.0 <= fault.hold <= 15.0
    assert fault.label.startswith(fault.kind)


_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0 0 100 1 0
   1: 0100007F:9C40 0100007F:4E20 01 00000000:00000000 00:00000000 00000000  0 0 101 1 0
   2: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000  0 0 102 1 0
   3: 0100007F:1F90 0100007F:C351 01 00000000:00000000 00:00000000 00000000  0 0 999 1 0
"""


def test_sockets_are_sorted_by_peer_and_only_the_processs_own_count() -> None:
    """Listening on 8080 (0x1F90), one connection to engine 20000 (0x4E20), one client; inode
    999 belongs to another process; 103 is no longer in the table."""
    lines = _TCP.splitlines()[1:]
    got = classify_sockets(
        lines, {"100", "101", "102", "103"}, frozenset({8080}), frozenset({20000})
    )
    assert got == Sockets(upstream=1, clients=1, listening=1, other=1)


def test_log_problems_are_stacks_tracebacks_and_unhandled_errors() -> None:
    lines = [
        json.dumps({"level": "info", "msg": "node-1 joined", "node": "node-1"}),
        json.dumps({"level": "error", "msg": "boom", "stack": "Traceback ..."}),
        json.dumps({"level": "warn", "msg": "node-2 left after 3 tries", "node": "node-2"}),
        json.dumps({"level": "warn", "msg": "node-3 left after 12 tries", "node": "node-3"}),
        "Unhandled Error",
        "",
    ]
    summary = summarize_log(lines)
    assert summary.levels == Counter({"info": 1, "error": 1, "warn": 2, "unparsed": 1})
    assert len(summary.problems) == 2
    assert summary.messages["warn -: <node> left after # tries"] == 1
    assert summary.messages["warn -: <node> left after ## tries"] == 1


def _sample(
    fds: int = 25,
    rss_kb: int = 60_000,
    in_flight: int | None = 0,
    reservations: dict[str, int] | None = None,
) -> Sample:
    return Sample(
        0, "x", rss_kb, fds, 12, 0, in_flight, {} if reservations is None else reservations, 0, 0
    )


def _tally(*kinds: str) -> Tally:
    tally = Tally()
    for kind in kinds:
        tally.sent += 1
        tally.record("stream", Outcome(kind, 200 if kind != CLOSED else None))
    return tally


_CLEAN = LogSummary(Counter(), Counter(), ())


def test_a_clean_run_passes_every_criterion() -> None:
    """Cuts and closes are clean ends, not failures."""
    verdicts = judge(
        _sample(),
        _sample(fds=90),
        _sample(fds=25 + FD_TOLERANCE),
        _tally(ANSWERED, CUT, CLOSED),
        _CLEAN,
        True,
    )
    assert all(v.passed for v in verdicts), verdicts


def test_each_leak_fails_its_own_criterion() -> None:
    cases = {
        "every request answered or closed": (_tally(ANSWERED, TIMEOUT), {}),
        "in-flight back to 0": (_tally(ANSWERED), {"in_flight": 1}),
        "reservations empty": (_tally(ANSWERED), {"reservations": {"node-1": 1}}),
        f"fds back to baseline (+{FD_TOLERANCE})": (_tally(ANSWERED), {"fds": 26 + FD_TOLERANCE}),
        "RSS growth < 30 MB": (_tally(ANSWERED), {"rss_kb": 60_000 + 31 * 1024}),
    }
    for criterion, (tally, final) in cases.items():
        verdicts = judge(_sample(), _sample(), _sample(**final), tally, _CLEAN, True)  # type: ignore[arg-type]
        assert [v.criterion for v in verdicts if not v.passed] == [criterion]


def test_a_request_that_never_finished_fails() -> None:
    tally = _tally(ANSWERED)
    tally.sent += 1
    verdicts = judge(_sample(), _sample(), _sample(), tally, _CLEAN, True)
    assert [v.criterion for v in verdicts if not v.passed] == ["every request answered or closed"]


def test_missing_reservations_field_fails_rather_than_passes() -> None:
    """An admin /status without ``reservations`` is not evidence that none are held."""
    final = Sample(0, "x", 60_000, 25, 12, 0, 0, None, 0, 0)
    verdicts = judge(_sample(), _sample(), final, _tally(ANSWERED), _CLEAN, True)
    assert [v.criterion for v in verdicts if not v.passed] == ["reservations empty"]


def test_the_soak_reads_readiness_from_the_status_document_the_proxy_serves() -> None:
    """``make soak`` waits for every node to be up: it must read the document's real shape (it
    once read a ``control`` key the document no longer has, and never started)."""
    fleet = Fleetish()
    doc = status_document(OLLAMA, ControlState(), {}, flight, 0, fleet.view, fleet.clock.seconds())
    doc = json.loads(json.dumps(doc))
    assert fleet_up(doc, ["ollama"], ["a", "c"])
    assert not fleet_up(doc, ["ollama"], ["a", "b"])  # b is down
    assert not fleet_up(doc, ["ollama"], ["d"])  # d is not polled yet
    assert not fleet_up(doc, ["ollama", "lmstudio"], ["a"])  # no such facade
    assert not fleet_up({"control": {}}, ["ollama"], ["a"])
    assert not fleet_up(None, ["ollama"], ["a"])
