"""The failover loop on a Clock (docs/request-path.md#the-failover-loop,
docs/retry-budget.md, docs/candidate-order.md#reservations; issue 3).

Each test holds one rule; time only moves when the test advances the clock.
"""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.error import ConnectingCancelledError, ConnectionLost
from twisted.python.failure import Failure
from twisted.web.client import ResponseNeverReceived
from twisted.web.http_headers import Headers

from nvpair.control.state import PriorityEntry
from nvpair.engines.table import RouteClass
from nvpair.wire.message import BodySink, End, Ended, Fields
from tests.fakes import Harness, Response, harness, node

A, B, C = node("a", "m"), node("b", "m"), node("c", "m")


def fired(d: Deferred[Any]) -> bool:
    return bool(d.called)


def settle(h: Harness, seconds: float = 0.0) -> None:
    h.clock.advance(seconds)


# -- failover within a round ---------------------------------------------------------------


def test_retryable_status_fails_over_within_the_round_without_backoff() -> None:
    h = harness()
    h.nodes(A, B)
    request, _ = h.serve()
    h.upstream.calls[0].answer(Response(503, b'{"error":"busy"}'))
    assert h.upstream.bases == ["http://a", "http://b"]
    h.upstream.calls[1].answer(Response(200, b"hello"))
    assert request.status == 200 and request.body == b"hello" and request.finished


def test_transport_error_fails_over() -> None:
    h = harness()
    h.nodes(A, B)
    request, _ = h.serve()
    h.upstream.calls[0].refuse()
    h.upstream.calls[1].answer(Response(200, b"ok"))
    assert request.body == b"ok"


def test_backoff_between_rounds_doubles_and_caps_at_8x() -> None:
    """Round ends → release, sleep retry-backoff, doubling, at most 8x."""
    h = harness(retry_backoff=1.0, max_dispatch_attempts=10, job_deadline=1000.0)
    h.nodes(A)
    h.serve()
    gaps = []
    for _ in range(6):
        h.upstream.calls[-1].answer(Response(503, b""))
        before = len(h.upstream.calls)
        waited = 0.0
        while len(h.upstream.calls) == before:
            h.clock.advance(0.5)
            waited += 0.5
        gaps.append(waited)
    assert gaps == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_same_node_is_retried_when_it_is_the_only_owner() -> None:
    h = harness(retry_backoff=1.0)
    h.nodes(A)
    request, _ = h.serve()
    for _ in range(4):
        h.upstream.calls[-1].answer(Response(500, b""))
        h.clock.advance(10)
    assert h.upstream.bases == ["http://a"] * 5
    h.upstream.calls[-1].answer(Response(200, b"fifth"))
    assert request.body == b"fifth"


# -- the final attempt answers for itself --------------------------------------------------


def test_final_attempt_status_and_body_pass_through_unchanged() -> None:
    h = harness(retry_backoff=0.1)
    h.nodes(A, B)
    request, _ = h.serve()
    for _ in range(4):
        h.upstream.calls[-1].answer(Response(503, b"busy"))
        h.clock.advance(10)
    assert len(h.upstream.calls) == 5
    h.upstream.calls[-1].answer(Response(429, b'{"error":"slow down"}'))
    assert request.status == 429 and request.body == b'{"error":"slow down"}'
    assert request.reason() is None
    h.clock.advance(100)
    assert len(h.upstream.calls) == 5


def test_final_attempt_transport_failure_is_502() -> None:
    h = harness(max_dispatch_attempts=2, retry_backoff=0.1)
    h.nodes(A)
    request, _ = h.serve()
    h.upstream.calls[0].refuse()
    h.clock.advance(1)
    h.upstream.calls[1].refuse()
    assert request.status == 502 and request.reason() == "upstream-transport"


def test_final_attempt_first_body_timeout_is_504_never_a_commit() -> None:
    h = harness(max_dispatch_attempts=1, response_header_timeout=30.0)
    h.nodes(A)
    request, _ = h.serve()
    response = h.upstream.calls[0].answer(Response(200))  # headers, and no body yet
    h.clock.advance(29.9)
    assert not request.started
    h.clock.advance(0.2)
    assert request.status == 504 and request.reason() == "first-body-timeout"
    assert response.connection.state == "stopped"


# -- the commit point ----------------------------------------------------------------------


def test_headers_do_not_commit_the_first_body_byte_does() -> None:
    """A stalled engine that sent headers is failed over after the first-body timeout."""
    h = harness(response_header_timeout=5.0)
    h.nodes(A, B)
    request, _ = h.serve()
    stalled = h.upstream.calls[0].answer(Response(200))
    h.clock.advance(4.9)
    assert len(h.upstream.calls) == 1 and not request.started
    h.clock.advance(0.2)
    assert stalled.connection.state == "stopped"
    served = h.upstream.calls[1].answer(Response(200))
    served.send(b"d")
    served.send(b"ata")
    served.end()
    assert request.status == 200 and request.body == b"data" and request.finished


def test_first_body_timer_starts_when_headers_arrive() -> None:
    h = harness(response_header_timeout=5.0)
    h.nodes(A)
    request, _ = h.serve()
    h.clock.advance(4.0)  # headers take 4 s: within the header cap
    response = h.upstream.calls[0].answer(Response(200))
    h.clock.advance(4.0)  # 8 s since dispatch, 4 since headers: still waiting
    response.send(b"x")
    response.end()
    assert request.body == b"x" and len(h.upstream.calls) == 1


def test_a_body_that_came_with_its_headers_commits_without_a_first_body_timer() -> None:
    """A whole answer in one read (most non-streamed ones) has nothing to wait for: no
    first-body timer is armed, so the only timer left is the client write deadline's."""
    h = harness(response_header_timeout=5.0, client_write_timeout=60.0)
    h.nodes(A)
    request, _ = h.serve()
    armed: list[float] = []
    call_later = h.clock.callLater

    def recording(delay: float, f: Any, *args: Any, **kwargs: Any) -> Any:
        armed.append(delay)
        return call_later(delay, f, *args, **kwargs)

    h.clock.callLater = recording  # type: ignore[method-assign,assignment]
    h.upstream.calls[0].answer(Response(200, b"whole"))
    assert request.status == 200 and request.body == b"whole" and request.finished
    assert 5.0 not in armed


def test_a_connection_lost_before_the_first_byte_still_fails_over() -> None:
    """The first-body gate already settled, with a failure: classified as a transport
    failure and retried, never committed."""
    h = harness(response_header_timeout=5.0)
    h.nodes(A, B)
    request, _ = h.serve()

    class DeadOnArrival(Response):
        """Its connection was already lost when the body is asked for."""

        def connect(self, sink: BodySink) -> None:
            sink.end(Ended(End.CUT, ConnectionLost()))

    h.upstream.calls[0].answer(DeadOnArrival(200))
    assert len(h.upstream.calls) == 2
    h.upstream.calls[1].answer(Response(200, b"ok"))
    assert request.status == 200 and request.body == b"ok"


def test_header_timeout_is_a_retryable_failure() -> None:
    h = harness(response_header_timeout=5.0)
    h.nodes(A, B)
    h.serve()
    h.clock.advance(5.1)
    assert h.upstream.calls[0].cancelled and len(h.upstream.calls) == 2


def test_eof_with_no_bytes_commits() -> None:
    h = harness()
    h.nodes(A, B)
    request, _ = h.serve()
    h.upstream.calls[0].answer(Response(200, b""))
    assert request.status == 200 and request.finished and request.body == b""
    assert len(h.upstream.calls) == 1


def test_after_commit_nothing_is_retried() -> None:
    """A node dying mid-stream truncates the answer; the client sees the connection close."""
    h = harness()
    h.nodes(A, B)
    request, d = h.serve()
    response = h.upstream.calls[0].answer(Response(200))
    response.send(b"partial")
    response.die()
    assert request.body == b"partial" and request.lost and not request.finished
    h.clock.advance(100)
    assert len(h.upstream.calls) == 1 and fired(d)


# -- status table --------------------------------------------------------------------------


def test_4xx_other_than_404_408_429_is_the_answer() -> None:
    h = harness()
    h.nodes(A, B)
    request, _ = h.serve()
    h.upstream.calls[0].answer(Response(400, b'{"error":"bad"}'))
    assert request.status == 400 and request.body == b'{"error":"bad"}'
    assert len(h.upstream.calls) == 1


def test_404_is_retried_on_inference_routes() -> None:
    h = harness()
    h.nodes(A, B)
    request, _ = h.serve()
    h.upstream.calls[0].answer(Response(404, b"stale inventory"))
    h.upstream.calls[1].answer(Response(200, b"ok"))
    assert request.body == b"ok"


def test_3xx_is_forwarded_verbatim() -> None:
    h = harness()
    h.nodes(A, B)
    request, _ = h.serve()
    h.upstream.calls[0].answer(Response(307, b""))
    assert request.status == 307 and len(h.upstream.calls) == 1


# -- budget and deadline -------------------------------------------------------------------


def test_deadline_is_checked_before_dispatch_and_never_truncates_one() -> None:
    """Slow failures: the deadline ends the job before the budget (503 deadline)."""
    h = harness(job_deadline=600.0, response_header_timeout=240.0, retry_backoff=0.25)
    h.nodes(A)
    request, _ = h.serve()
    h.clock.advance(240.0)  # attempt 1: header timeout
    h.clock.advance(0.25)
    h.clock.advance(240.0)  # attempt 2 ends at ~480 s
    h.clock.advance(0.5)
    assert len(h.upstream.calls) == 3  # attempt 3 starts before 600 s...
    h.clock.advance(115.0)  # ...and is not cut at the deadline
    assert not request.started and not h.upstream.calls[2].cancelled
    h.clock.advance(130.0)  # its own cap ends it; no fourth dispatch past the deadline
    h.clock.advance(5.0)
    assert len(h.upstream.calls) == 3
    assert request.status == 503 and request.reason() == "deadline"
    assert request.fields().has(b"Retry-After")


def test_no_owner_at_admission_is_502_at_once() -> None:
    h = harness()
    h.nodes(node("a", "other"))
    request, _ = h.serve()
    assert request.status == 502 and request.reason() == "no-owner" and not h.upstream.calls


def test_no_owner_names_the_model_it_looked_for() -> None:
    """Issue 12: the proxy's own no-owner answer says which model nobody advertises, as the
    client named it; the reason code, the status and the dialect's envelope stay."""
    h = harness()
    h.nodes(node("a", "other"))
    request, _ = h.serve(model="qwen2.5-7b")
    assert request.json() == {
        "error": {
            "message": 'no node advertises model "qwen2.5-7b"',
            "type": "nvpair_proxy",
            "code": "no-owner",
        }
    }
    h.control.set_discovery("ollama", [node("a", "other")])
    plain, _ = h.serve(model="Llama3", engine="ollama", route_path="/api/chat")
    assert plain.status == 502 and plain.reason() == "no-owner"
    assert plain.json() == {"error": 'no node advertises model "Llama3"'}


def test_no_owner_after_dispatch_waits_at_no_attempt_cost() -> None:
    h = harness(retry_backoff=1.0, max_dispatch_attempts=2)
    h.nodes(A)
    request, _ = h.serve()
    h.upstream.calls[0].answer(Response(503, b""))
    h.nodes()  # the owner blinks out
    h.clock.advance(30)
    assert len(h.upstream.calls) == 1 and request.status is None
    h.nodes(A)
    h.clock.advance(8)
    assert len(h.upstream.calls) == 2
    h.upstream.calls[1].answer(Response(200, b"back"))
    assert request.body == b"back"


def test_no_owner_until_the_deadline_is_503_no_owner_timeout() -> None:
    h = harness(retry_backoff=1.0, job_deadline=20.0)
    h.nodes(A)
    request, _ = h.serve()
    h.upstream.calls[0].answer(Response(503, b""))
    h.nodes()
    h.clock.advance(25)
    assert request.status == 503 and request.reason() == "no-owner-timeout"
    retry_after = request.fields().first(b"Retry-After")
    assert retry_after is not None and int(retry_after) >= 1


# -- cancellation --------------------------------------------------------------------------


def test_node_leaving_discovery_cancels_the_attempt_promptly() -> None:
    """The watcher cancels the attempt, which counts as a dispatch; the loop fails over."""
    h = harness(max_dispatch_attempts=5)
    h.nodes(A, B)
    request, _ = h.serve()
    stalled = h.upstream.calls[0].answer(Response(200))
    h.nodes(B)
    assert stalled.connection.state == "stopped"
    assert h.upstream.bases == ["http://a", "http://b"]
    h.upstream.calls[1].answer(Response(200, b"from b"))
    assert request.body == b"from b"


def test_node_leaving_before_headers_cancels_the_dial() -> None:
    h = harness()
    h.nodes(A, B)
    h.serve()
    h.nodes(B)
    assert h.upstream.calls[0].cancelled and len(h.upstream.calls) == 2


def test_committed_first_byte_wins_over_the_watcher() -> None:
    h = harness()
    h.nodes(A, B)
    request, _ = h.serve()
    response = h.upstream.calls[0].answer(Response(200))
    response.send(b"first")
    h.nodes(B)  # an announcement gap after commit changes nothing
    response.send(b" rest")
    response.end()
    assert request.body == b"first rest" and len(h.upstream.calls) == 1


def test_requester_leaving_ends_the_loop_and_closes_the_upstream() -> None:
    h = harness()
    h.nodes(A, B)
    request, d = h.serve()
    response = h.upstream.calls[0].answer(Response(200))
    response.send(b"x")
    request.disconnect()
    assert response.connection.state == "stopped" and fired(d)
    h.clock.advance(100)
    assert len(h.upstream.calls) == 1


def test_requester_leaving_during_backoff_dispatches_nothing_more() -> None:
    h = harness(retry_backoff=5.0)
    h.nodes(A)
    request, d = h.serve()
    h.upstream.calls[0].answer(Response(503, b""))
    request.disconnect()
    h.clock.advance(100)
    assert len(h.upstream.calls) == 1 and fired(d)


def test_requester_leaving_mid_dial_cancels_it() -> None:
    h = harness()
    h.nodes(A)
    request, _ = h.serve()
    request.disconnect()
    assert h.upstream.calls[0].cancelled


def test_requester_leaving_while_connecting_is_not_a_transport_failure() -> None:
    """However the dial fails when cancelled, the parent scope decides: no further attempt."""
    from twisted.internet.endpoints import HostnameEndpoint
    from twisted.internet.error import ConnectingCancelledError

    h = harness()
    h.upstream.cancel_error = ConnectingCancelledError(HostnameEndpoint)
    h.nodes(A, B)
    request, d = h.serve()
    request.disconnect()
    h.clock.advance(100)
    assert len(h.upstream.calls) == 1 and fired(d)


#: What an upstream client may fail a cancelled request with: Agent's two, and the plain
#: CancelledError of nvpair.wire.client.upstream once connected.
CANCEL_ERRORS = [
    pytest.param(ResponseNeverReceived([Failure(CancelledError())]), id="agent-connected"),
    pytest.param(ConnectingCancelledError(HostnameEndpoint), id="dialling"),
    pytest.param(CancelledError(), id="connected"),
]


@pytest.mark.parametrize("error", CANCEL_ERRORS)
def test_a_cancel_is_judged_by_who_cancelled_not_by_its_error(error: Exception) -> None:
    """Header timeout and node leaving fail over; the requester leaving ends the loop."""
    h = harness(response_header_timeout=5.0)
    h.upstream.cancel_error = error
    h.nodes(A, B, C)
    request, d = h.serve()
    h.clock.advance(5.1)
    assert h.upstream.bases == ["http://a", "http://b"] and not fired(d)
    h.nodes(A, C)
    assert h.upstream.bases == ["http://a", "http://b", "http://c"] and not fired(d)
    request.disconnect()
    h.clock.advance(100)
    assert len(h.upstream.calls) == 3 and fired(d)
    assert all(call.cancelled for call in h.upstream.calls)


def test_shutdown_cancels_what_is_in_flight() -> None:
    h = harness()
    h.nodes(A)
    request, d = h.serve()
    h.path.cancel_all()
    assert h.upstream.calls[0].cancelled and request.lost and fired(d)
    assert h.path.in_flight == 0


def test_client_that_accepts_nothing_is_dropped() -> None:
    h = harness(client_write_timeout=60.0)
    h.nodes(A)
    request, d = h.serve()
    response = h.upstream.calls[0].answer(Response(200))
    response.send(b"x")
    flow = request.flow
    assert flow is not None
    flow.pause()  # the client's channel stops taking bytes
    h.clock.advance(59)
    assert not request.aborted()
    flow.resume()
    flow.pause()
    h.clock.advance(61)
    assert request.aborted()
    request.disconnect()
    assert response.connection.state == "stopped" and fired(d)


# -- reservations --------------------------------------------------------------------------


def test_burst_spreads_across_equally_idle_owners() -> None:
    h = harness()
    h.nodes(A, B, C)
    for _ in range(6):
        h.serve()
    assert sorted(h.upstream.bases) == ["http://a"] * 2 + ["http://b"] * 2 + ["http://c"] * 2
    assert dict(h.reservations.counts) == {"a": 2, "b": 2, "c": 2}


def test_reservation_follows_the_dispatch_and_is_released_at_the_end() -> None:
    h = harness()
    h.nodes(A, B)
    h.serve()
    assert dict(h.reservations.counts) == {"a": 1}
    h.upstream.calls[0].answer(Response(503, b""))
    assert dict(h.reservations.counts) == {"b": 1}
    response = h.upstream.calls[1].answer(Response(200))
    response.send(b"x")
    assert dict(h.reservations.counts) == {"b": 1}
    response.end()
    assert dict(h.reservations.counts) == {}


def test_reservation_is_released_before_backoff() -> None:
    h = harness(retry_backoff=5.0)
    h.nodes(A)
    h.serve()
    h.upstream.calls[0].answer(Response(503, b""))
    assert dict(h.reservations.counts) == {}
    h.clock.advance(5)
    assert dict(h.reservations.counts) == {"a": 1}


def test_eligible_pin_takes_no_reservation() -> None:
    h = harness()
    h.nodes(A, B)
    h.control.set_pin("lmstudio", "b")
    h.serve()
    assert h.upstream.bases == ["http://b"] and dict(h.reservations.counts) == {}


def test_redelivered_snapshot_does_not_clear_live_reservations() -> None:
    h = harness()
    h.nodes(A, B)
    entries = [PriorityEntry("a", 0, 0), PriorityEntry("b", 0, 0)]
    assert h.control.set_priority(7, entries)
    h.serve()
    h.serve()
    assert dict(h.reservations.counts) == {"a": 1, "b": 1}
    assert not h.control.set_priority(7, entries)
    assert dict(h.reservations.counts) == {"a": 1, "b": 1}
    assert h.control.set_priority(8, entries)
    assert dict(h.reservations.counts) == {}


# -- non-inference routes ------------------------------------------------------------------


def test_other_routes_try_each_candidate_once_without_backoff() -> None:
    h = harness()
    h.nodes(A, B)
    request, _ = h.serve(route_path="/api/v1/models/load")
    h.upstream.calls[0].answer(Response(503, b"a busy"))
    assert len(h.upstream.calls) == 2
    h.upstream.calls[1].answer(Response(503, b"b busy"))
    h.clock.advance(1000)
    assert len(h.upstream.calls) == 2
    assert request.status == 503 and request.body == b"b busy"


def test_404_is_an_answer_on_other_routes() -> None:
    h = harness()
    h.nodes(A, B)
    request, _ = h.serve(route_path="/api/v1/models/load")
    h.upstream.calls[0].answer(Response(404, b"nope"))
    assert request.status == 404 and len(h.upstream.calls) == 1


def test_other_route_without_any_node_is_502_no_owner() -> None:
    h = harness()
    request, _ = h.serve(route_path="/api/v1/models/load")
    assert request.status == 502 and request.reason() == "no-owner"
    # The engine has no node at all: the message says so, and names the model asked for.
    assert request.json()["error"]["message"] == 'no LM Studio node is available for model "m"'


# -- containment ---------------------------------------------------------------------------


def test_failure_copying_a_body_closes_the_client_and_still_releases() -> None:
    h = harness()
    h.nodes(A)
    request, d = h.serve()
    response = h.upstream.calls[0].answer(Response(200))
    response.send(b"first")
    assert dict(h.reservations.counts) == {"a": 1}

    def broken(data: bytes) -> None:
        raise RuntimeError("the client's transport blew up")

    request.data = broken  # type: ignore[assignment]
    response.send(b"second")
    assert request.lost and response.connection.state == "stopped"
    response.die()
    assert fired(d) and dict(h.reservations.counts) == {} and h.path.in_flight == 0


def test_a_committed_stream_keeps_one_copy_of_each_head() -> None:
    """docs/performance.md#held-streams: while a stream is relayed, the engine's fields live
    only in the client's answer (the answer lets go of them once written, and the request of
    its own: tests/wire/server/test_facade_server.py), the client's in what the attempts sent."""
    h = harness()
    h.nodes(A)
    request, _ = h.serve()
    sent = h.upstream.calls[0]
    assert isinstance(sent.headers, Fields)
    assert sent.headers.first(b"Content-Type") == b"application/json"
    served = sent.answer(Response(200))
    served.send(b"d")
    # The engine's fields are the client's answer's, given up by the engine's head, not copied.
    assert request.status == 200 and served.headers == {}
    assert request.fields().first(b"Content-Type") == b"application/json"
    served.end()
    assert request.body == b"d" and request.finished


def test_what_the_nodes_are_sent_is_made_once_and_the_request_keeps_its_head() -> None:
    """Issue 34 item 3: every node is sent one copy of the client's end-to-end fields, made
    with the job; the client's head keeps every field it came with, so a preflight reads its
    ``Origin`` after the copy was made (docs/browser-policy.md#preflight-intersection)."""
    h = harness()
    h.nodes(A, B)
    came = {
        b"Origin": [b"http://app.example"],
        b"Access-Control-Request-Method": [b"POST"],
        b"Connection": [b"x-hop"],
        b"X-Hop": [b"1"],
        b"Cookie": [b"c=1"],
    }
    request, d = h.serve(
        route_path="/v1/models", method=b"OPTIONS", route=RouteClass.PREFLIGHT, fields=came
    )
    first, second = h.upstream.calls
    assert first.headers is second.headers and isinstance(first.headers, Fields)
    assert first.headers == {
        b"Content-Type": [b"application/json"],
        b"Origin": [b"http://app.example"],
        b"Access-Control-Request-Method": [b"POST"],
    }
    assert request.head.fields == Fields.of({b"Content-Type": [b"application/json"], **came})
    grant = Headers({b"access-control-allow-origin": [b"http://app.example"]})
    first.answer(Response(204, b"", grant))
    second.answer(Response(204, b"", grant))
    assert request.status == 204 and fired(d)
    assert request.fields().first(b"Access-Control-Allow-Origin") == b"http://app.example"
