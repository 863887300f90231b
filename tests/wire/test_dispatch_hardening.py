"""The request path under input it used to mishandle (issue 9's findings), on a Clock."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock

from nvpair.control.state import Node
from nvpair.dispatch.relay import BodyRelay, WriteDeadline
from nvpair.wire.client.upstream import Upstream
from nvpair.wire.message import Answer, Fields
from nvpair.wire.trust.tls import PinnedPeers
from tests.fakes import Response, harness, node

A, B = node("a", "m"), node("b", "m")


def test_header_budget_starts_when_the_connection_is_up_not_at_the_dial() -> None:
    """Dial, headers and first content are budgets run in sequence
    (docs/retry-budget.md#per-attempt-budgets)."""
    h = harness(response_header_timeout=5.0)
    h.upstream.connect_at_once = False
    h.nodes(A, B)
    h.serve()
    h.clock.advance(8.0)  # a slow dial (the endpoint's own timeout governs it)
    assert len(h.upstream.calls) == 1 and not h.upstream.calls[0].cancelled
    h.upstream.calls[0].connected()
    h.clock.advance(4.9)
    assert [c.cancelled for c in h.upstream.calls] == [False]
    h.clock.advance(0.2)
    assert [c.cancelled for c in h.upstream.calls] == [True, False]
    assert h.upstream.bases == ["http://a", "http://b"]


def test_an_attempt_that_raises_while_starting_fails_over() -> None:
    h = harness()
    h.nodes(A, B)
    original = h.upstream.request

    def request(base_url: str, *args: Any) -> Deferred[Answer]:
        if base_url == "http://a":
            raise RuntimeError("cannot start")
        return original(base_url, *args)

    h.upstream.request = request  # type: ignore[method-assign,assignment]
    client, _ = h.serve()
    h.upstream.calls[0].answer(Response(200, b"from b"))
    assert client.body == b"from b"
    submitted = [
        info.get("scheduledOn") for m, info in h.workload_events() if m == "workload:submitted"
    ]
    assert "a" in submitted and "b" in submitted


def test_an_https_node_without_membership_fails_the_request_not_the_caller() -> None:
    """Dialling a peer with no usable trust is a failed Deferred, never a raise."""
    upstream = Upstream(
        MemoryReactorClock(), 1.0, PinnedPeers(lambda: None, lambda host, port: None)
    )
    d = upstream.request("https://127.0.0.1:9", b"POST", b"/x", Fields(), b"{}")
    failures: list[Any] = []
    d.addErrback(failures.append)
    assert failures and "not a cluster member" in str(failures[0].value)


def test_a_node_that_left_after_the_round_was_planned_costs_no_attempt() -> None:
    h = harness(max_dispatch_attempts=5, retry_backoff=1.0)
    h.nodes(A, B)
    client, _ = h.serve()
    pending = h.upstream.calls[0]
    h.nodes(A)  # b leaves while a is being tried
    pending.answer(Response(503, b""))
    assert h.upstream.bases == ["http://a"]  # b was skipped, not dispatched
    h.clock.advance(1.0)
    assert h.upstream.bases == ["http://a", "http://a"]
    h.upstream.calls[1].answer(Response(200, b"ok"))
    assert client.body == b"ok"
    submitted = [
        info.get("scheduledOn") for m, info in h.workload_events() if m == "workload:submitted"
    ]
    assert "b" not in submitted


def test_a_node_whose_url_changed_is_dialled_where_it_is_now() -> None:
    h = harness()
    h.nodes(A, B)
    h.serve()
    pending = h.upstream.calls[0]
    h.nodes(A, Node("b", False, "http://b-moved", ("m",), frozenset({"m"})))
    pending.answer(Response(503, b""))
    assert h.upstream.bases == ["http://a", "http://b-moved"]


def test_a_local_node_without_a_backend_is_no_candidate() -> None:
    h = harness()
    local = Node("me", True, None, ("m",), frozenset({"m"}))
    h.nodes(local)
    client, _ = h.serve()
    assert client.status == 502 and client.reason() == "no-owner"
    assert h.upstream.calls == [] and h.workload_events() == []


def test_a_local_node_without_a_backend_is_passed_over_for_one_with_an_address() -> None:
    h = harness()
    local = Node("me", True, None, ("m",), frozenset({"m"}))
    h.nodes(local, A)
    h.serve()
    assert h.upstream.bases == ["http://a"]
    submitted = [
        info.get("scheduledOn") for m, info in h.workload_events() if m == "workload:submitted"
    ]
    assert submitted == [None, "a"]


def test_zero_backoff_waits_for_discovery_instead_of_spinning() -> None:
    h = harness(retry_backoff=0.0, job_deadline=600.0)
    h.nodes(A)
    client, _ = h.serve()
    h.upstream.calls[0].answer(Response(503, b""))
    h.nodes()
    h.clock.advance(0)  # the zero backoff between rounds
    # One timer for the whole remaining deadline, not a wake-up every reactor turn.
    times = [c.getTime() for c in h.clock.getDelayedCalls()]
    assert 600 in times and all(t > h.clock.seconds() for t in times)
    h.clock.advance(100)
    assert len(h.upstream.calls) == 1
    h.nodes(A)  # the owner is back: dispatched at once
    assert len(h.upstream.calls) == 2
    assert all(round(c.getTime()) != 600 for c in h.clock.getDelayedCalls())
    h.upstream.calls[1].answer(Response(200, b"back"))
    assert client.body == b"back"


def test_waiting_for_an_owner_wakes_on_discovery_before_the_backoff() -> None:
    h = harness(retry_backoff=10.0)
    h.nodes(A)
    h.serve()
    h.upstream.calls[0].answer(Response(503, b""))
    h.nodes()
    h.clock.advance(10.0)
    h.nodes(A)
    assert len(h.upstream.calls) == 2


@pytest.mark.parametrize("paused", [True, False])
def test_the_write_deadline_is_disarmed_when_the_body_ends(paused: bool) -> None:
    clock = Clock()
    expired: list[bool] = []

    class Upstream_:
        def pause(self) -> None:
            pass

        def resume(self) -> None:
            pass

        def stop(self, abort: bool = False) -> None:
            pass

    guard = WriteDeadline(Upstream_(), clock, 60.0, lambda: expired.append(True))
    if paused:
        guard.pause()
    guard.disarm()
    clock.advance(120)
    assert expired == [] and clock.getDelayedCalls() == []


def test_a_client_paused_at_the_end_of_the_body_leaves_no_timer() -> None:
    h = harness(client_write_timeout=60.0)
    h.nodes(A)
    client, _ = h.serve()
    response = h.upstream.calls[0].answer(Response(200))
    response.send(b"chunk")
    flow = client.flow
    assert flow is not None
    flow.pause()  # the client stops reading...
    response.end()  # ...just as the body ends
    assert client.finished
    assert all(c.getTime() < 60 for c in h.clock.getDelayedCalls()), "deadline still armed"
    h.clock.advance(120)
    assert not client.lost


def test_body_relay_type_of_deadline_is_the_guard() -> None:
    """set_deadline wraps the upstream in a WriteDeadline the relay can disarm."""
    relay = BodyRelay(Response(200))
    relay.set_deadline(lambda upstream: WriteDeadline(upstream, Clock(), 1.0, lambda: None))
    assert relay._guard is None  # armed only once attached
