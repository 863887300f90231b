"""What a queued request costs in fleet plans: the order a round is planned in is made once
for a request the queue starts at once, and once per kind of waiter per pump for a saturated
fleet, not once per waiter (docs/fleet-scheduling.md#the-queue)."""

from __future__ import annotations

from typing import Any

from nvpair.dispatch.candidates import Candidates
from nvpair.dispatch.queueing import FleetQueue
from nvpair.fleet.health import HealthPolicy
from tests.fakes import Response, harness, node

POLICY = HealthPolicy(threshold=3, cooldown=5.0, cooldown_max=120.0)


def counted(candidates: Candidates) -> list[object]:
    """Every fleet plan ``candidates`` makes from now on, in a list."""
    made: list[object] = []
    plan = candidates.plan

    def counting(admitted: Any) -> Any:
        made.append(admitted)
        return plan(admitted)

    candidates.plan = counting  # type: ignore[method-assign]
    return made


def test_a_request_the_queue_starts_at_once_is_planned_once() -> None:
    h = harness(fleet=POLICY, queue=True)
    h.nodes(node("a", "m"))
    made = counted(h.path._services.candidates)
    request, _ = h.serve()
    assert len(h.upstream.calls) == 1 and len(made) == 1
    h.upstream.calls[0].answer(Response(200, b"{}"))
    assert request.status == 200


def test_a_saturated_fleet_plans_once_per_kind_when_a_place_frees() -> None:
    """One owner serving one request at a time, ten more of one caller's waiting: a place
    freed gives it to the first of them with one plan for it and one to learn that the rest
    can start nowhere, not one per waiter."""
    h = harness(fleet=POLICY, queue=True)
    h.nodes(node("a", "m"))
    queue = h.path._services.queue
    assert isinstance(queue, FleetQueue)
    queue.reconfigure(queue.options, {("lmstudio", "a"): 1})
    requests = [h.serve()[0] for _ in range(11)]
    assert len(h.upstream.calls) == 1
    made = counted(h.path._services.candidates)
    h.upstream.calls[0].answer(Response(200, b"{}"))
    assert requests[0].status == 200
    assert len(h.upstream.calls) == 2
    assert len(made) <= 2
