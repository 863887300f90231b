"""Fleet mode plays the scheduler, through the failover loop on a Clock (issue 13 items 2, 3, 5;
docs/fleet-scheduling.md): the order reads polled load states, each attempt's outcome feeds
passive health, and ``--owner-wait`` bounds the wait for a vanished owner. Broker mode is
unchanged."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.logger import capturedLogs

from nvpair.control.state import PriorityEntry
from nvpair.engines.loadstate import LoadState
from nvpair.fleet.health import HealthPolicy
from nvpair.fleet.scheduling import FleetScheduler
from tests.fakes import Harness, Response, harness, node

A, B = node("a", "m"), node("b", "m")
POLICY = HealthPolicy(threshold=3, cooldown=5.0, cooldown_max=120.0)
ENGINE = "lmstudio"


def fleet(**overrides: Any) -> tuple[Harness, FleetScheduler]:
    h = harness(fleet=POLICY, **overrides)
    assert h.fleet is not None
    h.nodes(A, B)
    return h, h.fleet


def dispatched(h: Harness) -> list[str]:
    return [call.base.removeprefix("http://") for call in h.upstream.calls]


# -- the order ------------------------------------------------------------------------------------


def test_a_warm_node_wins_over_a_lower_id() -> None:
    h, scheduler = fleet()
    scheduler.record_load(ENGINE, "b", LoadState(warm=frozenset({"m"})))
    request, _ = h.serve()
    h.upstream.calls[0].answer(Response(200, b"ok"))
    assert dispatched(h) == ["b"] and request.body == b"ok"


def test_a_loading_node_is_skipped_while_another_owner_is_there() -> None:
    h, scheduler = fleet()
    scheduler.record_load(ENGINE, "a", LoadState(loading=True))
    h.serve()
    h.upstream.calls[0].answer(Response(503, b""))
    # Not even after b fails: the next round goes to b again.
    h.clock.advance(1.0)
    assert dispatched(h) == ["b", "b"]


def test_the_only_owner_is_dispatched_to_even_while_loading() -> None:
    h, scheduler = fleet()
    h.nodes(A)
    scheduler.record_load(ENGINE, "a", LoadState(loading=True))
    h.serve()
    assert dispatched(h) == ["a"]


def test_a_busy_warm_node_beats_a_cold_one_and_spreads_otherwise() -> None:
    """Two warm one-slot nodes and a cold one: the third request goes to a busy warm node,
    never to the cold one."""
    h, scheduler = fleet()
    h.nodes(A, B, node("c", "m"))
    for warm in ("b", "c"):
        scheduler.record_load(ENGINE, warm, LoadState(warm=frozenset({"m"})))
    for _ in range(3):
        h.serve()
    assert dispatched(h) == ["b", "c", "b"]


def test_idle_time_requests_take_turns_over_equal_nodes() -> None:
    """Ties spread (issue 33 item 1, docs/fleet-scheduling.md#ties-spread): one request at a
    time to two equally idle warm owners goes to each in turn, the one dispatched to least
    recently first, instead of every one to ``a``, the lowest id."""
    h, scheduler = fleet()
    for each in ("a", "b"):
        scheduler.record_load(ENGINE, each, LoadState(warm=frozenset({"m"})))
    for index in range(4):
        h.serve()
        h.upstream.calls[index].answer(Response(200, b"ok"))
    assert dispatched(h) == ["a", "b", "a", "b"]


def test_a_failed_attempt_counts_as_a_dispatch_for_the_tie() -> None:
    """``a`` refused and ``b`` served the first request; ``a`` was sent to least recently, so
    the next idle-time request starts there."""
    h, scheduler = fleet()
    for each in ("a", "b"):
        scheduler.record_load(ENGINE, each, LoadState(warm=frozenset({"m"})))
    serve_through_a_refusing(h)
    h.serve()
    assert dispatched(h) == ["a", "b", "a"]


def test_broker_mode_ties_stay_in_priority_order() -> None:
    """Broker mode is unchanged: equal loads go to the earlier in the scheduler's order, every
    time, however recently it was sent to."""
    h = harness()
    h.nodes(A, B)
    h.control.set_priority(1, [PriorityEntry("a", 0, 0), PriorityEntry("b", 0, 0)])
    for index in range(3):
        h.serve()
        h.upstream.calls[index].answer(Response(200, b"ok"))
    assert dispatched(h) == ["a", "a", "a"]


def test_broker_mode_keeps_the_schedulers_order() -> None:
    """No fleet scheduling: priority order, whatever an engine would say."""
    h = harness()
    h.nodes(A, B)
    h.control.set_priority(1, [PriorityEntry("a", 0, 0), PriorityEntry("b", 0, 0)])
    h.serve()
    assert dispatched(h) == ["a"]


# -- passive health -------------------------------------------------------------------------------


def serve_through_a_refusing(h: Harness) -> None:
    """One request: ``a`` (first by id) refuses, ``b`` answers."""
    request, _ = h.serve()
    calls = h.upstream.open()
    if dispatched(h)[-1] == "a":
        calls[-1].refuse()
    h.upstream.open()[-1].answer(Response(200, b"ok"))
    assert request.body == b"ok"


def test_a_dead_node_is_held_back_and_tried_once_per_cooldown() -> None:
    h, scheduler = fleet()
    with capturedLogs() as events:
        for _ in range(3):
            serve_through_a_refusing(h)
    assert dispatched(h) == ["a", "b"] * 3
    assert scheduler.health.held(ENGINE, "a")
    assert any(e.get("log_format", "").startswith("{node} held back") for e in events)
    # Held back: ten more requests never touch it.
    for _ in range(10):
        serve_through_a_refusing(h)
    assert dispatched(h)[6:] == ["b"] * 10
    # After the cool-down, one trial; it fails, and the next cool-down is twice as long.
    h.clock.advance(5.0)
    serve_through_a_refusing(h)
    serve_through_a_refusing(h)
    assert dispatched(h)[16:] == ["a", "b", "b"]
    h.clock.advance(5.0)
    serve_through_a_refusing(h)
    assert dispatched(h)[19:] == ["b"]
    h.clock.advance(5.0)
    serve_through_a_refusing(h)
    assert dispatched(h)[20:] == ["a", "b"]


def test_a_held_back_node_returns_after_a_successful_trial() -> None:
    h, scheduler = fleet()
    for _ in range(3):
        serve_through_a_refusing(h)
    h.clock.advance(5.0)
    request, _ = h.serve()
    h.upstream.open()[-1].answer(Response(200, b"back"))
    assert dispatched(h)[-1] == "a" and request.body == b"back"
    assert not scheduler.health.held(ENGINE, "a")
    assert scheduler.health.of(ENGINE, "a").failures == 0


@pytest.mark.parametrize("status", [500, 503, 429, 404])
def test_a_retryable_status_counts_against_the_node(status: int) -> None:
    h, scheduler = fleet()
    h.serve()
    h.upstream.calls[0].answer(Response(status, b"{}"))
    assert scheduler.health.of(ENGINE, "a").failures == 1


def test_the_final_attempts_retryable_status_counts_too() -> None:
    """The last permitted attempt serves its 500 as the answer: still the node failing."""
    h, scheduler = fleet(max_dispatch_attempts=1)
    request, _ = h.serve()
    h.upstream.calls[0].answer(Response(500, b"{}"))
    assert request.status == 500
    assert scheduler.health.of(ENGINE, "a").failures == 1


def test_an_answer_that_is_not_retried_is_the_node_answering() -> None:
    h, scheduler = fleet()
    serve_through_a_refusing(h)
    request, _ = h.serve()
    h.upstream.open()[-1].answer(Response(400, b'{"error":"bad"}'))
    assert request.status == 400 and dispatched(h)[-1] == "a"
    assert scheduler.health.of(ENGINE, "a").failures == 0


def test_a_first_body_timeout_counts_against_the_node() -> None:
    h, scheduler = fleet(response_header_timeout=30.0)
    h.serve()
    h.upstream.calls[0].answer(Response(200))
    h.clock.advance(30.0)
    assert scheduler.health.of(ENGINE, "a").failures == 1
    assert dispatched(h) == ["a", "b"]


def test_a_requester_leaving_says_nothing_about_the_node() -> None:
    h, scheduler = fleet()
    request, _ = h.serve()
    request.disconnect()
    assert h.upstream.calls[0].cancelled
    assert scheduler.health.of(ENGINE, "a").failures == 0


def test_a_node_leaving_discovery_says_nothing_about_it() -> None:
    h, scheduler = fleet()
    h.serve()
    h.nodes(B)
    assert h.upstream.calls[0].cancelled
    assert scheduler.health.of(ENGINE, "a").failures == 0


def test_broker_mode_holds_nothing_back() -> None:
    h = harness()
    h.nodes(A, B)
    for _ in range(5):
        serve_through_a_refusing(h)
    assert dispatched(h) == ["a", "b"] * 5


# -- --owner-wait ---------------------------------------------------------------------------------


def vanish_after_one_attempt(h: Harness) -> tuple[Any, Deferred[None]]:
    """A request whose only owner fails once and then leaves discovery."""
    h.nodes(A)
    request, d = h.serve()
    h.upstream.calls[0].answer(Response(503, b""))
    h.nodes()
    return request, d


def test_fleet_mode_waits_at_most_owner_wait_then_503() -> None:
    """Counted from when the request finds no owner: after the 1 s backoff here."""
    h, _ = fleet(owner_wait=2.0)
    request, d = vanish_after_one_attempt(h)
    h.clock.advance(1.0)
    h.clock.advance(1.9)
    assert not request.started
    h.clock.advance(0.2)
    assert request.status == 503 and request.reason() == "no-owner-timeout"
    assert request.fields().has(b"Retry-After")
    assert d.called


def test_no_owner_timeout_names_the_wait_that_ran_out() -> None:
    """The owner wait, when its bound ended the wait; the job deadline when that came first
    (or when the owner wait is 0, or in broker mode)."""
    h, _ = fleet(owner_wait=2.0)
    request, _ = vanish_after_one_attempt(h)
    h.clock.advance(1.0)
    h.clock.advance(2.1)
    assert request.reason() == "no-owner-timeout"
    assert request.json()["error"]["message"] == (
        'no node serving model "m" came back within the owner wait (--owner-wait 2s)'
    )
    h, _ = fleet(owner_wait=0.0, job_deadline=60.0)
    request, _ = vanish_after_one_attempt(h)
    h.clock.advance(61.0)
    assert request.json()["error"]["message"] == (
        'no node serving model "m" came back within the job deadline (--job-deadline 1m0s)'
    )
    h, _ = fleet(owner_wait=120.0, job_deadline=60.0)
    request, _ = vanish_after_one_attempt(h)
    h.clock.advance(61.0)
    assert "within the job deadline (--job-deadline 1m0s)" in request.json()["error"]["message"]


def test_every_owner_down_is_said_not_a_wrong_name() -> None:
    """A model whose every node left discovery (their polls fail): 502 ``no-owner`` saying
    its nodes are down, by id; a model nobody listed still reads as nobody advertising it,
    and a node back in discovery is no longer named."""
    h, scheduler = fleet()
    scheduler.away(ENGINE, "b", ["m", "other"])
    scheduler.away(ENGINE, "a", ["m"])
    scheduler.away(ENGINE, "c", ["other"])
    h.nodes()
    request, _ = h.serve()
    assert (request.status, request.reason()) == (502, "no-owner")
    assert request.json()["error"]["message"] == 'every node that serves model "m" is down: a, b'
    request, _ = h.serve(model="unheard-of")
    assert request.json()["error"]["message"] == 'no node advertises model "unheard-of"'
    scheduler.away(ENGINE, "a", None)
    scheduler.forget(ENGINE, "b")
    request, _ = h.serve()
    assert request.json()["error"]["message"] == 'no node advertises model "m"'


def test_an_owner_coming_back_in_time_serves_the_request() -> None:
    h, _ = fleet(owner_wait=2.0)
    request, _ = vanish_after_one_attempt(h)
    h.clock.advance(1.5)
    h.nodes(A)
    h.upstream.open()[-1].answer(Response(200, b"ok"))
    assert request.body == b"ok"


def test_the_wait_starts_afresh_each_time_every_owner_goes() -> None:
    h, _ = fleet(owner_wait=2.0, retry_backoff=0.5)
    # t=0: a fails and leaves; t=0.5 (the backoff): no owner, the wait starts (until 2.5).
    request, _ = vanish_after_one_attempt(h)
    h.clock.advance(1.5)
    # t=1.5: a is back and dispatched to at once; it fails and leaves again.
    h.nodes(A)
    h.upstream.open()[-1].answer(Response(503, b""))
    h.nodes()
    # t=3.5 (backoff now 2 s): no owner again, a fresh wait (until 5.5), not the old one.
    h.clock.advance(2.0)
    assert request.status is None
    h.clock.advance(1.9)
    assert request.status is None
    h.clock.advance(0.2)
    assert request.reason() == "no-owner-timeout"


def test_owner_wait_zero_waits_up_to_the_deadline() -> None:
    h, _ = fleet(owner_wait=0.0, job_deadline=60.0)
    request, _ = vanish_after_one_attempt(h)
    h.clock.advance(59.0)
    assert request.status is None
    h.clock.advance(1.5)
    assert request.reason() == "no-owner-timeout"


def test_broker_mode_ignores_owner_wait() -> None:
    h = harness(owner_wait=2.0, job_deadline=60.0)
    request, _ = vanish_after_one_attempt(h)
    h.clock.advance(30.0)
    assert request.status is None
    h.clock.advance(31.0)
    assert request.reason() == "no-owner-timeout"


# -- the scheduler's own bookkeeping --------------------------------------------------------------


def test_busy_slots_do_not_count_the_proxys_own_requests_twice() -> None:
    own = {("llamacpp", "a"): 2}
    scheduler = FleetScheduler(
        harness().clock, POLICY, lambda engine, node_id: own.get((engine, node_id), 0)
    )
    scheduler.record_load("llamacpp", "a", LoadState(warm_all=True, slots=4, busy=3))
    assert scheduler.load("llamacpp", "a").busy == 1
    scheduler.record_load("llamacpp", "a", LoadState(warm_all=True, slots=4, busy=1))
    assert scheduler.load("llamacpp", "a").busy == 0
    scheduler.record_load("llamacpp", "b", LoadState(warm_all=True, slots=4, busy=3))
    assert scheduler.load("llamacpp", "b").busy == 3


# -- dispatched is loading (docs/fleet-scheduling.md#dispatched-is-loading) -----------------------


def test_a_second_request_joins_the_load_the_first_set_off() -> None:
    """Both owners cold, no poll since: the first request goes to ``a`` (by id) and ``a`` is
    loading the model from then on, so the second joins it there instead of loading it on
    ``b`` (in memory but busy ranks before not in memory)."""
    h, _ = fleet()
    h.serve()
    h.serve()
    assert dispatched(h) == ["a", "a"]


def test_without_the_dispatch_the_second_request_would_load_elsewhere() -> None:
    """The contrast: what a poll says alone spreads the two onto both cold owners."""
    h = harness()
    h.nodes(A, B)
    h.serve()
    h.serve()
    assert dispatched(h) == ["a", "b"]


def test_a_poll_asked_after_the_dispatch_has_the_last_word() -> None:
    h, scheduler = fleet()
    h.serve()
    h.upstream.calls[0].answer(Response(200, b"ok"))
    # Asked before the dispatch (or within a second of it): the answer is older than the load.
    # ``b`` says it does not hold m: were ``a`` believed as its answer says, the two would tie
    # and ``b``, never dispatched to, would go first (docs/fleet-scheduling.md#ties-spread).
    scheduler.record_load(ENGINE, "a", LoadState(warm=frozenset()), asked_at=h.clock.seconds())
    scheduler.record_load(ENGINE, "b", LoadState(warm=frozenset()), asked_at=0.0)
    h.serve()
    assert dispatched(h) == ["a", "a"]
    h.upstream.calls[1].answer(Response(200, b"ok"))
    # Asked well after it: ``a`` says m is gone (evicted, say), and b has it.
    h.clock.advance(5.0)
    scheduler.record_load(ENGINE, "a", LoadState(warm=frozenset()), asked_at=h.clock.seconds())
    scheduler.record_load(ENGINE, "b", LoadState(warm=frozenset({"m"})), asked_at=h.clock.seconds())
    h.serve()
    assert dispatched(h) == ["a", "a", "b"]


def test_a_dispatch_does_not_wake_a_loading_engine() -> None:
    """A llama.cpp server loading as a whole stays loading: skipped while another owner is
    there, whatever was sent to it."""
    h, scheduler = fleet()
    scheduler.dispatched(ENGINE, "a", "m")
    scheduler.record_load(ENGINE, "a", LoadState(loading=True), asked_at=-10.0)
    assert scheduler.standing(ENGINE, "a").load.loading
    h.serve()
    assert dispatched(h) == ["b"]


def test_a_reload_forgets_what_was_dispatched() -> None:
    _, scheduler = fleet()
    scheduler.dispatched(ENGINE, "a", "m")
    scheduler.forget(ENGINE, "a")
    assert scheduler.standing(ENGINE, "a").load == LoadState()


def test_a_model_less_request_assumes_nothing() -> None:
    _, scheduler = fleet()
    scheduler.dispatched(ENGINE, "a", None)
    assert scheduler.standing(ENGINE, "a").load == LoadState()


def test_a_load_on_a_box_seen_holding_one_model_evicts_the_one_it_held() -> None:
    """A box every reading has shown holding one model at a time (a small Ollama box): once a
    second model is sent to it, the first counts out of memory until a poll says otherwise, so
    the queue and the order do not send it a request for the model it has just swapped out."""
    h, scheduler = fleet()
    scheduler.record_load(ENGINE, "a", LoadState(warm=frozenset({"m"})), asked_at=0.0)
    h.clock.advance(5.0)
    scheduler.dispatched(ENGINE, "a", "n")
    assert scheduler.standing(ENGINE, "a").load.warm == frozenset({"n"})
    # The next poll has the last word: it still holds m (it had room after all).
    h.clock.advance(5.0)
    scheduler.record_load(
        ENGINE, "a", LoadState(warm=frozenset({"m", "n"})), asked_at=h.clock.seconds()
    )
    assert scheduler.standing(ENGINE, "a").load.warm == frozenset({"m", "n"})


def test_a_box_seen_holding_two_models_keeps_both_through_a_load() -> None:
    h, scheduler = fleet()
    scheduler.record_load(ENGINE, "a", LoadState(warm=frozenset({"m", "n"})), asked_at=0.0)
    scheduler.record_load(ENGINE, "a", LoadState(warm=frozenset({"m"})), asked_at=1.0)
    h.clock.advance(5.0)
    scheduler.dispatched(ENGINE, "a", "o")
    assert scheduler.standing(ENGINE, "a").load.warm == frozenset({"m", "o"})
    # A third model would take it past what it has held: only what was sent counts, the
    # latest sent first, as many as it has held.
    h.clock.advance(1.0)
    scheduler.dispatched(ENGINE, "a", "p")
    assert scheduler.standing(ENGINE, "a").load.warm == frozenset({"o", "p"})
    # A reload forgets what it was seen holding.
    scheduler.forget(ENGINE, "a")
    scheduler.record_load(ENGINE, "a", LoadState(warm=frozenset({"m"})), asked_at=7.0)
    h.clock.advance(5.0)
    scheduler.dispatched(ENGINE, "a", "o")
    assert scheduler.standing(ENGINE, "a").load.warm == frozenset({"o"})
