# -*- test-case-name: tests.observe.test_recent -*-
"""The last workloads for ``/status`` (:mod:`nvpair.observe.recent`, ``recent`` in
:mod:`nvpair.observe.status`; docs/operations.md#recent-workloads): the bounded ring, how attempts
and outcomes read in the document, and the request path feeding it — all without a reactor."""

from __future__ import annotations

import json
from typing import Any

from nvpair.control.state import ControlState
from nvpair.dispatch.attempt import Failed, Fault, Served
from nvpair.dispatch.relay import BodyRelay
from nvpair.dispatch.workload import State, Workloads
from nvpair.engines.inferstats import Stats
from nvpair.observe.metrics import Metrics
from nvpair.observe.recent import RECENT, AttemptRecord, RecentWorkloads
from nvpair.observe.recentview import recent_document, recent_workload
from nvpair.observe.status import status_document
from tests.fakes import ClientRequest, Harness, Response, harness, node

A, B = node("a", "m"), node("b", "m")


def _served(status: int) -> Served:
    answer = Response(status, b"")
    return Served(answer.head, BodyRelay(answer))


def workloads() -> Workloads:
    return Workloads(lambda method, params: None, lambda: 1_700_000_000_000, run_id="0" * 16)


# -- the ring ---------------------------------------------------------------------------------


def test_the_ring_keeps_the_last_workloads_newest_first() -> None:
    """Bounded: the oldest drops out as a new one is admitted; read newest first."""
    ring = RecentWorkloads(size=3)
    issued = workloads()
    for _ in range(5):
        ring.admitted(issued.admit("ollama", "llama3"))
    assert len(ring) == 3
    assert [trail.workload.id for trail in ring.newest_first()] == ["5", "4", "3"]


def test_the_ring_holds_200_by_default() -> None:
    """The documented ``recent``: the last 200 workloads."""
    ring = RecentWorkloads()
    issued = workloads()
    for _ in range(RECENT + 1):
        ring.admitted(issued.admit("ollama", "llama3"))
    assert RECENT == 200 and len(ring) == 200
    assert ring.newest_first()[-1].workload.id == "2"


def test_attempts_are_recorded_as_the_docs_name_their_results() -> None:
    """Each ended dispatch becomes ``{node, result, status}``: ``served`` with the answer's
    status, or the failure's kind with the status the node answered, if any."""
    trail = RecentWorkloads().admitted(workloads().admit("ollama", "llama3"))
    trail.attempt_ended("a", Failed(Fault.STATUS, status=503))
    trail.attempt_ended("b", Failed(Fault.TRANSPORT, detail="header timeout"))
    trail.attempt_ended("c", Failed(Fault.FIRST_BODY_TIMEOUT, status=200))
    trail.attempt_ended("d", Failed(Fault.NODE_LEFT))
    trail.attempt_ended("e", _served(200))
    assert trail.attempts == [
        AttemptRecord("a", "status", 503),
        AttemptRecord("b", "transport", None, "header timeout"),
        AttemptRecord("c", "first_body_timeout", 200),
        AttemptRecord("d", "node_left"),
        AttemptRecord("e", "served", 200),
    ]


# -- the document -----------------------------------------------------------------------------


def test_a_completed_workload_reads_with_its_path_and_the_engines_figures() -> None:
    """Every field the docs name, the attempts in dispatch order, times in UTC."""
    trail = RecentWorkloads().admitted(workloads().admit("ollama", "llama3:latest"))
    trail.attempt_ended("a", Failed(Fault.STATUS, status=503))
    trail.attempt_ended("b", _served(200))
    trail.workload.started("b")
    trail.workload.terminal(State.COMPLETED, None, Stats(3, 40, 42.5, 180, False))
    assert recent_workload(trail) == {
        "id": "1",
        "engine": "ollama",
        "model": "llama3:latest",
        "state": "completed",
        "error": None,
        "attempts": [
            {"node": "a", "result": "status", "status": 503, "detail": None},
            {"node": "b", "result": "served", "status": 200, "detail": None},
        ],
        "ttftMs": 180,
        "tokensPerSecond": 42.5,
        "facade": "ollama",
        "admittedAt": "2023-11-14T22:13:20.000+00:00",
        "endedAt": "2023-11-14T22:13:20.000+00:00",
        "queuedMs": None,
    }


def test_a_rate_over_a_handful_of_tokens_is_not_shown() -> None:
    """Issue 31 item 7: 12 tokens out of one batch at "10,481/s" is no decode speed."""
    trail = RecentWorkloads().admitted(workloads().admit("llamacpp", "tiny", facade="openai"))
    trail.workload.terminal(State.COMPLETED, None, Stats(5, 12, 10481.0, 20, False))
    entry = recent_workload(trail)
    assert entry["tokensPerSecond"] is None and entry["ttftMs"] == 20
    assert (entry["facade"], entry["engine"]) == ("openai", "llamacpp")
    trail = RecentWorkloads().admitted(workloads().admit("llamacpp", "tiny"))
    trail.workload.terminal(State.COMPLETED, None, Stats(5, 16, 80.0, 20, False))
    assert recent_workload(trail)["tokensPerSecond"] == 80.0


def test_an_estimated_rate_is_not_shown() -> None:
    """``tokensPerSecond`` only when the engine reported usage; a rate from counted stream
    events is null (the time to first byte is measured by the proxy and stays)."""
    trail = RecentWorkloads().admitted(workloads().admit("llamacpp", "tiny"))
    trail.workload.terminal(State.COMPLETED, None, Stats(None, 12, 30.0, 90, True))
    entry = recent_workload(trail)
    assert (entry["ttftMs"], entry["tokensPerSecond"]) == (90, None)


def test_a_workload_in_flight_and_one_the_proxy_refused() -> None:
    """Queued with no attempt ended yet: no outcome, no figures. Refused: ``failed`` and the
    proxy's reason, the ``X-Nvpair-Error`` the client got."""
    ring = RecentWorkloads()
    issued = workloads()
    waiting = ring.admitted(issued.admit("lmstudio", ""))
    refused = ring.admitted(issued.admit("lmstudio", "qwen"))
    refused.attempt_ended("a", Failed(Fault.NODE_LEFT))
    refused.workload.terminal(State.FAILED, "no-owner-timeout", None)
    newest, oldest = recent_document(ring)
    assert (newest["state"], newest["error"], newest["ttftMs"]) == (
        "failed",
        "no-owner-timeout",
        None,
    )
    assert newest["attempts"] == [
        {"node": "a", "result": "node_left", "status": None, "detail": None}
    ]
    assert oldest["id"] == waiting.workload.id and oldest["model"] == ""
    assert (oldest["state"], oldest["error"], oldest["attempts"], oldest["endedAt"]) == (
        "queued",
        None,
        [],
        None,
    )


def test_status_carries_recent_only_where_something_records_it() -> None:
    """Without a ring (no admin listener, or a test's bare document) ``recent`` is empty."""
    control = ControlState()
    bare = status_document({}, control, {}, lambda e, n: 0, 0, None, 0.0)
    assert bare["recent"] == []
    ring = RecentWorkloads()
    ring.admitted(workloads().admit("ollama", "llama3"))
    doc = status_document({}, control, {}, lambda e, n: 0, 0, None, 0.0, ring)
    assert [entry["id"] for entry in doc["recent"]] == ["1"]  # type: ignore[attr-defined]
    json.dumps(doc, allow_nan=False)


# -- fed by the request path ------------------------------------------------------------------

USAGE = (
    b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":40},'
    b'"stats":{"tokens_per_second":42.5}}'
)


def only(ring: RecentWorkloads) -> dict[str, Any]:
    (entry,) = recent_document(ring)
    return entry


def test_a_failover_is_recorded_attempt_by_attempt() -> None:
    """503 from ``a``, then ``b`` serves: both attempts, ``running`` from the commit,
    ``completed`` with the engine's figures at the end."""
    ring = RecentWorkloads()
    h = harness(recent=ring)
    h.nodes(A, B)
    request, _ = h.serve()
    assert only(ring)["state"] == "queued" and only(ring)["attempts"] == []
    h.upstream.calls[0].answer(Response(503, b'{"error":"busy"}'))
    h.clock.advance(0.25)
    served = h.upstream.calls[1].answer(Response(200))
    served.send(b"{")
    running = only(ring)
    assert running["state"] == "running"
    assert [(a["node"], a["result"], a["status"]) for a in running["attempts"]] == [
        ("a", "status", 503),
        ("b", "served", 200),
    ]
    served.send(USAGE[1:])
    served.end()
    assert request.finished
    done = only(ring)
    assert (done["state"], done["error"]) == ("completed", None)
    assert (done["ttftMs"], done["tokensPerSecond"]) == (250, 42.5)


def streaming() -> tuple[RecentWorkloads, Metrics, Harness, ClientRequest, Response]:
    """A request on ``a`` recorded and counted, committed with the first bytes of a stream."""
    ring, metrics = RecentWorkloads(), Metrics()
    h = harness(recent=ring, metrics=metrics)
    h.nodes(A)
    request, _ = h.serve()
    served = h.upstream.calls[0].answer(Response(200))
    served.send(b'{"response":"he')
    assert [a["result"] for a in only(ring)["attempts"]] == ["served"]
    return ring, metrics, h, request, served


def test_a_stream_its_node_cuts_is_a_truncated_attempt_of_a_completed_workload() -> None:
    """The engine's connection ends before the body's end: the workload still ``completed``
    (the terminal event does not change), the attempt ``truncated`` with its status, and
    ``nvpair_attempts_total`` counts it truncated, never served."""
    ring, metrics, h, request, served = streaming()
    assert metrics.attempts == {}
    served.die()
    entry = only(ring)
    assert (entry["state"], entry["error"]) == ("completed", None)
    assert entry["attempts"] == [
        {"node": "a", "result": "truncated", "status": 200, "detail": None}
    ]
    assert metrics.attempts == {("lmstudio", "a", "truncated"): 1}
    ends = [(m, i) for m, i in h.workload_events() if m.endswith(("completed", "errored"))]
    assert [(m, i["state"]) for m, i in ends] == [("workload:completed", "completed")]
    assert not request.finished


def test_a_stream_whose_reader_leaves_is_served_not_truncated() -> None:
    """A client that goes mid-stream cuts the answer itself: the attempt stays served."""
    ring, metrics, _, request, _ = streaming()
    request.disconnect()
    assert [a["result"] for a in only(ring)["attempts"]] == ["served"]
    assert metrics.attempts == {("lmstudio", "a", "served"): 1}


def test_the_final_attempt_failing_reads_as_the_proxys_reason() -> None:
    """Both attempts failed at the transport, the second the final one: ``failed`` with
    ``upstream-transport``, each attempt naming the exception's class."""
    ring = RecentWorkloads()
    h = harness(recent=ring, max_dispatch_attempts=2)
    h.nodes(A, B)
    request, _ = h.serve()
    h.upstream.calls[0].refuse()
    h.upstream.calls[1].refuse()
    assert request.reason() == "upstream-transport"
    entry = only(ring)
    assert (entry["state"], entry["error"]) == ("failed", "upstream-transport")
    assert entry["attempts"] == [
        {"node": n, "result": "transport", "status": None, "detail": "ConnectionRefusedError"}
        for n in ("a", "b")
    ]


def test_a_requester_who_leaves_is_cancelled_with_its_attempt_unfinished() -> None:
    """The dispatch in progress when the requester left never ended: it is not listed."""
    ring = RecentWorkloads()
    h = harness(recent=ring)
    h.nodes(A)
    request, _ = h.serve()
    request.disconnect()
    entry = only(ring)
    assert (entry["state"], entry["error"], entry["attempts"]) == (
        "cancelled",
        "requester-gone",
        [],
    )


def test_a_request_never_admitted_is_not_a_workload() -> None:
    """No owner at admission: refused before any workload exists, so nothing is recorded."""
    ring = RecentWorkloads()
    h = harness(recent=ring)
    h.nodes(A)
    request, _ = h.serve(model="nobody-has-it")
    assert request.reason() == "no-owner" and len(ring) == 0


def test_a_keyed_workload_names_its_key_in_recent_and_in_its_events() -> None:
    """Where [access] is in force each entry and event carries ``key``: the name, or null for
    a keyless caller; elsewhere neither carries one (docs/lan.md#keys)."""
    from nvpair.engines.caller import KEYLESS, Caller

    events: list[Any] = []
    issued = Workloads(lambda m, p: events.append(p["workloadInfo"]), lambda: 0, run_id="0" * 16)
    ring = RecentWorkloads()
    for caller in (Caller("laptop"), KEYLESS, None):
        ring.admitted(issued.admit("ollama", "llama3", caller=caller))
    entries = recent_document(ring)
    assert [entry.get("key", "absent") for entry in entries] == ["absent", None, "laptop"]
    assert [event.get("key", "absent") for event in events] == ["laptop", None, "absent"]
