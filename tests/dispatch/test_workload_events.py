"""Workload lifecycle events and node activity on a Clock (docs/request-path.md#workload-lifecycle;
issue 4)."""

from __future__ import annotations

from typing import Any

import pytest

from nvpair.dispatch.activity import NodeActivity
from tests.fakes import Harness, Response, harness, node

A, B = node("a", "m"), node("b", "m")


def sequence(h: Harness) -> list[tuple[str, str, str | None]]:
    """(method, state, scheduledOn) of each workload event, checking seq as it goes."""
    out = []
    for index, (method, info) in enumerate(h.workload_events(), start=1):
        assert info["seq"] == index
        out.append((method.split(":")[1], info["state"], info.get("scheduledOn")))
    return out


def terminal(h: Harness) -> dict[str, Any]:
    ends = [i for m, i in h.workload_events() if m in ("workload:completed", "workload:errored")]
    assert len(ends) == 1, "exactly one terminal event"
    return ends[0]


def test_failover_sequence() -> None:
    h = harness()
    h.nodes(A, B)
    h.clock.advance(1000)
    h.serve()
    h.upstream.calls[0].answer(Response(503, b""))
    h.clock.advance(0.5)
    response = h.upstream.calls[1].answer(Response(200))
    response.send(b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":5}}\n\n')
    h.clock.advance(1.0)
    response.end()
    assert sequence(h) == [
        ("submitted", "queued", None),
        ("submitted", "queued", "a"),
        ("submitted", "queued", None),
        ("submitted", "queued", "b"),
        ("started", "running", "b"),
        ("completed", "completed", "b"),
    ]
    info = terminal(h)
    assert info["createdAt"] == 1_000_000 and info["startedAt"] == 1_000_500
    assert info["completedAt"] == 1_001_500 and info["error"] is None
    assert info["runId"] == "0123456789abcdef" and info["id"] == "1"
    assert info["model"] == "m" and info["engine"] == "lmstudio"
    assert info["originatedFrom"] == "" and info["requesterId"] is None
    assert info["stats"] == {
        "promptTokens": 2,
        "completionTokens": 5,
        "ttftMs": 500,
        "tokensPerSecond": 5.0,
        "estimated": False,
    }


def test_stall_sequence_then_served() -> None:
    h = harness(response_header_timeout=5.0)
    h.nodes(A, B)
    h.serve()
    h.upstream.calls[0].answer(Response(200))
    h.clock.advance(6)
    h.upstream.calls[1].answer(Response(200, b"x"))
    assert [s[0] for s in sequence(h)] == ["submitted"] * 4 + ["started", "completed"]
    assert [s[2] for s in sequence(h)][:4] == [None, "a", None, "b"]


def test_cancel_sequence() -> None:
    h = harness()
    h.nodes(A)
    request, _ = h.serve()
    response = h.upstream.calls[0].answer(Response(200))
    response.send(b"x")
    request.disconnect()
    assert [s[:2] for s in sequence(h)][-1] == ("errored", "cancelled")
    assert terminal(h)["error"] == "requester-gone"


def test_cancel_while_queued_is_cancelled_not_a_node_failure() -> None:
    h = harness(retry_backoff=10.0)
    h.nodes(A)
    request, _ = h.serve()
    h.upstream.calls[0].answer(Response(503, b""))
    request.disconnect()
    info = terminal(h)
    assert info["state"] == "cancelled" and "scheduledOn" not in info


def test_a_400_commits_fails_and_is_not_measured() -> None:
    h = harness()
    h.nodes(A, B)
    h.serve()
    h.upstream.calls[0].answer(Response(400, b'{"usage":{"completion_tokens":3}}'))
    assert sequence(h) == [
        ("submitted", "queued", None),
        ("submitted", "queued", "a"),
        ("started", "running", "a"),
        ("errored", "failed", "a"),
    ]
    info = terminal(h)
    assert info["error"] == "upstream status 400" and "stats" not in info


def test_no_owner_at_admission_is_never_admitted() -> None:
    h = harness()
    h.nodes(node("a", "other"))
    h.serve()
    assert h.workload_events() == []


def test_non_inference_routes_produce_no_events() -> None:
    h = harness()
    h.nodes(A)
    h.serve(route_path="/api/v1/models/load")
    h.upstream.calls[0].answer(Response(200, b"{}"))
    assert h.workload_events() == []


def test_exhausted_budget_fails_with_the_reason() -> None:
    h = harness(max_dispatch_attempts=1)
    h.nodes(A)
    h.serve()
    h.upstream.calls[0].refuse()
    info = terminal(h)
    assert info["state"] == "failed" and info["error"] == "upstream-transport"


def test_deadline_fails_with_the_reason() -> None:
    h = harness(job_deadline=5.0, retry_backoff=10.0)
    h.nodes(A)
    h.serve()
    h.upstream.calls[0].answer(Response(503, b""))
    h.clock.advance(10)
    assert terminal(h)["error"] == "deadline"


def test_truncated_stream_still_completes() -> None:
    h = harness()
    h.nodes(A)
    h.serve()
    response = h.upstream.calls[0].answer(Response(200))
    response.send(b'{"response":"a","done":false}\n')
    response.die()
    info = terminal(h)
    assert info["state"] == "completed"
    assert info["stats"]["completionTokens"] == 1 and info["stats"]["estimated"] is True


def test_shutdown_is_cancelled() -> None:
    h = harness()
    h.nodes(A)
    h.serve()
    h.path.cancel_all()
    info = terminal(h)
    assert (info["state"], info["error"]) == ("cancelled", "shutdown")


def test_ids_count_per_process_and_seq_per_workload() -> None:
    h = harness()
    h.nodes(A)
    h.serve()
    h.serve()
    ids = {i["id"] for _, i in h.workload_events()}
    assert ids == {"1", "2"}
    for workload_id in ids:
        seqs = [i["seq"] for _, i in h.workload_events() if i["id"] == workload_id]
        assert seqs == list(range(1, len(seqs) + 1))


def test_model_is_the_normalized_display_name() -> None:
    h = harness()
    h.nodes(node("a", "registry.ollama.ai/library/llama3:latest"), engine="ollama")
    h.serve(model="Llama3", engine="ollama", route_path="/api/chat")
    # Ollama keys compare case-insensitively; the display form keeps the client's spelling.
    assert h.workload_events()[0][1]["model"] == "Llama3:latest"


# -- node activity --------------------------------------------------------------------------


def test_node_activity_counts_in_flight_dispatches() -> None:
    h = harness()
    h.nodes(A)
    h.serve()
    activity = [p for m, p in h.events if m == "discovery:node-activity"]
    assert activity == [{"nodeId": "a", "engine": "lmstudio", "inFlight": 1}]
    h.upstream.calls[0].answer(Response(200, b"x"))
    h.clock.advance(1)
    activity = [p for m, p in h.events if m == "discovery:node-activity"]
    assert activity[-1] == {"nodeId": "a", "engine": "lmstudio", "inFlight": 0}


def test_node_activity_is_coalesced_to_ten_per_second() -> None:
    from twisted.internet.task import Clock

    clock = Clock()
    sent: list[dict[str, object]] = []
    activity = NodeActivity(clock, lambda method, params: sent.append(params))
    blocks = [activity.tracking("ollama", "a") for _ in range(50)]
    for block in blocks:
        block.__enter__()
    assert [p["inFlight"] for p in sent] == [1]
    clock.advance(0.1)
    assert [p["inFlight"] for p in sent] == [1, 50]
    for block in blocks[:49]:
        block.__exit__(None, None, None)
    clock.advance(0.05)
    assert len(sent) == 2
    clock.advance(0.05)
    assert sent[-1]["inFlight"] == 1
    clock.advance(10)
    assert len(sent) == 3


def test_a_bug_mid_request_still_ends_with_one_terminal_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = harness()
    h.nodes(A)

    def broken(*args: object) -> object:
        raise RuntimeError("a bug in the dispatch path")

    # Not the upstream client: an exception while an attempt starts is that node's transport
    # failure (docs/robustness.md); a bug in the path itself is what this test is about.
    monkeypatch.setattr("nvpair.dispatch.delivery.deliver", broken)
    _, d = h.serve()
    h.upstream.calls[0].answer(Response(200, b"ok"))
    failures: list[object] = []
    d.addErrback(failures.append)
    info = terminal(h)
    assert (info["state"], info["error"]) == ("failed", "internal") and len(failures) == 1
    assert h.path.in_flight == 0 and dict(h.reservations.counts) == {}


def test_no_event_is_built_when_nobody_consumes_it() -> None:
    """Fleet mode below debug level: the workload's events are counted, never built."""
    from nvpair.dispatch.workload import Workloads

    sent: list[str] = []

    def emit(method: str, params: dict[str, Any]) -> None:
        sent.append(method)

    wanted = [False]
    workloads = Workloads(emit, lambda: 0, run_id="r", wanted=lambda: wanted[0])
    workload = workloads.admit("ollama", "m")
    workload.submitted("a")
    assert sent == [] and workload.seq == 2
    wanted[0] = True
    workload.started("a")
    assert sent == ["workload:started"] and workload.seq == 3


def test_node_activity_is_counted_but_never_reported_or_timed_when_nobody_consumes_it() -> None:
    """Fleet mode below debug level: the in-flight counts (which the fleet's order reads) are
    kept, no report is built and no coalescing timer armed; once wanted, reports resume from
    the counts as they are."""
    from twisted.internet.task import Clock

    clock = Clock()
    sent: list[dict[str, object]] = []
    wanted = [False]
    activity = NodeActivity(clock, lambda method, params: sent.append(params), lambda: wanted[0])
    blocks = [activity.tracking("ollama", "a") for _ in range(3)]
    for block in blocks:
        block.__enter__()
    blocks[0].__exit__(None, None, None)
    assert activity.in_flight("ollama", "a") == 2
    assert sent == [] and clock.getDelayedCalls() == []
    wanted[0] = True
    blocks[1].__exit__(None, None, None)
    assert sent == [{"nodeId": "a", "engine": "ollama", "inFlight": 1}]
