"""The in-process routing-cost fixture: every model routable, spread as described."""

from __future__ import annotations

from collections import Counter

from bench.routecost import ENGINE, admitted, fleet, per_request_us, route
from nvpair.control.reservations import Reservations
from nvpair.dispatch.candidates import Candidates
from nvpair.dispatch.seams import PriorityScheduling


def test_every_model_lives_on_two_nodes() -> None:
    control = fleet(nodes=8, models=100)
    held = Counter(m for node in control.discovery(ENGINE).nodes for m in node.models)
    assert len(held) == 100
    assert set(held.values()) == {2}


def test_a_two_node_fleet_holds_every_model_on_both() -> None:
    nodes = fleet(nodes=2, models=50).discovery(ENGINE).nodes
    assert [len(n.models) for n in nodes] == [50, 50]


def test_every_request_is_routed_to_an_owner() -> None:
    control = fleet(nodes=16, models=200)
    candidates = Candidates(control, Reservations(), PriorityScheduling(control))
    for i in (0, 17, 199):
        url = route(candidates, admitted(f"model-{i}"))
        owners = {n.url for n in control.discovery(ENGINE).nodes if f"model-{i}" in n.models}
        assert url in owners


def test_cost_is_measured_per_request() -> None:
    assert 0 < per_request_us(nodes=4, models=100, requests=50) < 10_000
