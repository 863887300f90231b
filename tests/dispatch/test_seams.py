"""The request path's seams (docs/request-path.md#seams): it orders rounds, waits for owners
and reports attempts through the :class:`~nvpair.dispatch.seams.Scheduling` it is given, whichever
it is, and reports to null observers when no admin listener runs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from nvpair.config import Config
from nvpair.control.routing import Plan
from nvpair.control.state import Node, PriorityEntry
from nvpair.dispatch.attempt import Failed, Fault
from nvpair.dispatch.budget import Bounds
from nvpair.dispatch.seams import NO_LOG, NOT_RECORDED, PriorityScheduling
from nvpair.dispatch.workload import Workloads
from nvpair.service import request_bounds
from tests.fakes import Response, harness, node

A, B, C = node("a", "m"), node("b", "m"), node("c", "m")


class Backwards:
    """A scheduling of the test's own: the reverse of the ids, a fixed owner wait, and every
    call it is asked, in order."""

    def __init__(self, owner_wait: float = 0.0, down: Sequence[str] = ()) -> None:
        self.owner_wait = owner_wait
        self.down = list(down)
        self.told: list[tuple[object, ...]] = []

    def plan(
        self,
        engine: str,
        eligible: Sequence[Node],
        pin: str | None,
        model_key: str | None,
        reservations: Mapping[str, int],
        prefix: Sequence[int] = (),
    ) -> Plan:
        ordered = sorted(eligible, key=lambda n: n.id, reverse=True)
        return Plan(tuple(ordered), False, ordered[0].id if ordered else None)

    def plan_across(
        self,
        eligible: Sequence[Node],
        model_key: Callable[[str], str | None],
        reservations: Mapping[str, int],
        prefix: Sequence[int] = (),
    ) -> Plan:
        return self.plan("", eligible, None, None, reservations)

    def owners_down(self, engine: str, model_key: str | None) -> list[str]:
        return self.down

    def starting(self, engine: str) -> bool:
        return False

    def dispatching(self, engine: str, node: str, model_key: str | None) -> bool:
        self.told.append(("dispatching", node, model_key))
        return node == "c"

    def succeeded(self, engine: str, node: str) -> None:
        self.told.append(("succeeded", node))

    def failed(self, engine: str, node: str, trial: bool, why: str) -> None:
        self.told.append(("failed", node, trial, why))

    def answered(
        self,
        engine: str,
        node: str,
        model_key: str | None,
        prefix: Sequence[int],
        stats: object,
        affine: bool,
    ) -> None:
        self.told.append(("answered", node, model_key, affine))


def test_the_rounds_order_is_the_schedulings_and_it_hears_each_attempt() -> None:
    scheduling = Backwards()
    h = harness(scheduling=scheduling)
    h.nodes(A, B, C)
    request, _ = h.serve()
    h.upstream.calls[0].answer(Response(503, b""))
    h.upstream.calls[1].refuse()
    h.upstream.calls[2].answer(Response(200, b"ok"))
    assert [call.base for call in h.upstream.calls] == ["http://c", "http://b", "http://a"]
    assert request.body == b"ok"
    assert scheduling.told == [
        ("dispatching", "c", "m"),
        ("failed", "c", True, "status 503"),
        ("dispatching", "b", "m"),
        ("failed", "b", False, "transport"),
        ("dispatching", "a", "m"),
        ("succeeded", "a"),
        ("answered", "a", "m", False),
    ]


def test_a_requester_leaving_tells_the_scheduling_nothing_of_the_node() -> None:
    scheduling = Backwards()
    h = harness(scheduling=scheduling)
    h.nodes(A)
    request, _ = h.serve()
    request.disconnect()
    assert scheduling.told == [("dispatching", "a", "m")]


def test_the_schedulings_owner_wait_bounds_the_wait_for_an_owner() -> None:
    h = harness(scheduling=Backwards(owner_wait=3.0), job_deadline=60.0)
    h.nodes(A)
    request, _ = h.serve()
    h.upstream.calls[0].answer(Response(503, b""))
    h.nodes()
    h.clock.advance(1.0)  # the backoff
    h.clock.advance(2.9)
    assert request.status is None
    h.clock.advance(0.2)
    assert request.reason() == "no-owner-timeout"
    assert "--owner-wait 3s" in request.json()["error"]["message"]


def test_a_refusal_for_want_of_an_owner_names_the_owners_the_scheduling_knows_down() -> None:
    h = harness(scheduling=Backwards(down=["gpu-7"]))
    request, _ = h.serve()
    assert request.reason() == "no-owner" and "gpu-7" in request.json()["error"]["message"]


def test_broker_mode_orders_by_the_schedulers_priority_and_judges_no_node() -> None:
    h = harness()
    scheduling = PriorityScheduling(h.control)
    h.control.set_priority(1, [PriorityEntry("b", 0.0, 0.0), PriorityEntry("a", 0.0, 0.0)])
    assert [n.id for n in scheduling.plan("lmstudio", [A, B], None, "m", {}).candidates] == [
        "b",
        "a",
    ]
    assert scheduling.owner_wait == 0.0
    assert scheduling.owners_down("lmstudio", "m") == []
    assert scheduling.dispatching("lmstudio", "a", "m") is False


def test_without_an_admin_listener_every_workload_shares_one_log_that_keeps_nothing() -> None:
    workloads = Workloads(lambda method, params: None, lambda: 0)
    first = NOT_RECORDED.admitted(workloads.admit("lmstudio", "m"))
    second = NOT_RECORDED.admitted(workloads.admit("lmstudio", "m"))
    assert first is second is NO_LOG
    first.attempt_ended("a", Failed(Fault.TRANSPORT))
    assert vars(first) == {}


def test_the_bounds_are_the_options_of_the_same_names() -> None:
    names = [field.name for field in attrs.fields(Bounds)]
    options: dict[str, Any] = {name: index + 1 for index, name in enumerate(names)}
    bounds = request_bounds(Config(state_dir=Path("/nonexistent"), **options))
    assert {name: getattr(bounds, name) for name in names} == options
