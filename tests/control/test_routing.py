"""Candidate selection (docs/candidate-order.md)."""

from __future__ import annotations

from nvpair.control.routing import default_order, owners, plan
from nvpair.control.state import Discovery, Node, Priority, PriorityEntry


def node(node_id: str, *models: str, local: bool = False) -> Node:
    return Node(node_id, local, None if local else f"http://{node_id}", models, frozenset(models))


A, B, C = node("a", "m"), node("b", "m"), node("c", "m", "x")
LOCAL = node("z", "m", local=True)
EMPTY = node("e")


def ids(nodes: object) -> list[str]:
    return [n.id for n in nodes]  # type: ignore[attr-defined]


def test_owners_are_the_nodes_advertising_the_model() -> None:
    """Step 1: only nodes whose inventory has the model are eligible."""
    assert ids(owners(Discovery((A, B, C)), "x")) == ["c"]
    assert owners(Discovery((A, B)), "nope") == []


def test_modelless_request_is_eligible_on_any_node_with_a_model() -> None:
    """Model-less inference: every node advertising at least one model."""
    assert ids(owners(Discovery((A, EMPTY, C)), None)) == ["a", "c"]


def test_default_order_is_local_first_then_id() -> None:
    assert ids(default_order([C, A, LOCAL, B])) == ["z", "a", "b", "c"]


def test_without_scheduler_snapshot_every_node_is_listed_in_default_order() -> None:
    """Before node/set-priority (and in fleet mode) all nodes are listed with no load."""
    result = plan([C, B, A], None, Priority(), {})
    assert ids(result.candidates) == ["a", "b", "c"]
    assert result.reserve == "a" and not result.pinned


def test_eligible_pin_goes_first_and_takes_no_reservation() -> None:
    result = plan([A, B, C], "c", Priority(), {})
    assert ids(result.candidates) == ["c", "a", "b"]
    assert result.pinned and result.reserve is None


def test_ineligible_pin_never_overrides_the_capability_gate() -> None:
    """A pin on a node that does not advertise the model is ignored, never added."""
    result = plan([A, B], "c", Priority(), {})
    assert ids(result.candidates) == ["a", "b"]
    assert not result.pinned and result.reserve == "a"


def test_priority_list_then_unlisted_in_default_order() -> None:
    priority = Priority(1, (PriorityEntry("c", 0, 0), PriorityEntry("b", 0, 0)))
    result = plan([A, B, C, LOCAL], None, priority, {})
    assert ids(result.candidates) == ["c", "b", "z", "a"]


def test_least_estimated_loaded_listed_candidate_moves_to_front() -> None:
    """Step 3: pending + gpuPressure + reservations, least first; ties to priority order."""
    priority = Priority(1, (PriorityEntry("a", 2, 0.5), PriorityEntry("b", 1, 0.9)))
    result = plan([A, B], None, priority, {})
    assert ids(result.candidates) == ["b", "a"] and result.reserve == "b"
    result = plan([A, B], None, priority, {"b": 1})
    assert ids(result.candidates) == ["a", "b"] and result.reserve == "a"


def test_ties_go_to_the_earlier_in_priority_order() -> None:
    priority = Priority(1, (PriorityEntry("b", 1, 0), PriorityEntry("a", 1, 0)))
    assert ids(plan([A, B], None, priority, {}).candidates) == ["b", "a"]


def test_reservations_spread_equally_idle_nodes() -> None:
    """With no scheduler, the process's own reservations alone spread the load."""
    assert plan([A, B, C], None, Priority(), {"a": 1}).reserve == "b"
    assert plan([A, B, C], None, Priority(), {"a": 1, "b": 1}).reserve == "c"


def test_pin_stays_first_while_the_rest_is_load_ordered() -> None:
    priority = Priority(1, (PriorityEntry("a", 5, 0), PriorityEntry("b", 0, 0)))
    result = plan([A, B, C], "c", priority, {})
    assert ids(result.candidates) == ["c", "b", "a"] and result.reserve is None


def test_fanout_order_is_pin_priority_default_without_load() -> None:
    """Inventories and preflights ask nodes in candidate order, unaffected by load."""
    from nvpair.control.routing import order

    priority = Priority(1, (PriorityEntry("c", 9, 0), PriorityEntry("b", 0, 0)))
    assert ids(order([A, B, C, LOCAL], None, priority)) == ["c", "b", "z", "a"]
    assert ids(order([A, B, C, LOCAL], "a", priority)) == ["a", "c", "b", "z"]
    assert ids(order([A, B, C, LOCAL], None, Priority())) == ["z", "a", "b", "c"]


def test_a_first_snapshot_of_generation_zero_is_applied() -> None:
    from nvpair.control.state import ControlState, PriorityEntry

    control = ControlState()
    assert control.set_priority(0, [PriorityEntry("b", 0, 0)])
    assert control.priority.entries == (PriorityEntry("b", 0, 0),)
    assert not control.set_priority(0, [])  # a redelivery of it is not


def test_a_first_snapshot_of_generation_zero_supersedes_earlier_reservations() -> None:
    from nvpair.control.reservations import Reservations
    from nvpair.control.state import ControlState, PriorityEntry

    control, reservations = ControlState(), Reservations()
    control.on_priority(lambda p: reservations.new_snapshot(p.generation))
    before = reservations.take("b")
    assert control.set_priority(0, [PriorityEntry("b", 1, 0)])
    assert dict(reservations.counts) == {}  # the snapshot's pending counts that work now
    reservations.release(before)
    assert dict(reservations.counts) == {}  # the superseded release changes nothing


def test_the_snapshot_index_agrees_with_a_scan() -> None:
    from nvpair.control.state import Discovery, Node

    held = [
        Node(f"n{i}", False, f"http://n{i}", (), frozenset({f"m{i % 3}", f"m{(i + 1) % 3}"}))
        for i in range(7)
    ]
    nodes = (*held, Node("empty", False, "http://e", (), frozenset()))
    discovery = Discovery(nodes)
    for key in ("m0", "m1", "m2", "nope"):
        assert list(discovery.owners(key)) == [n for n in nodes if key in n.model_keys]
    assert list(discovery.owners(None)) == [n for n in nodes if n.model_keys]
    assert discovery.node("n3") is nodes[3] and discovery.node("x") is None
    assert Discovery(nodes) == discovery
