"""Candidate order in standalone fleet mode (docs/fleet-scheduling.md#order, issue 13 item 2):
pin → in memory with a free slot → in memory but busy → not in memory; within a tier the least
estimated load, ties to the owner dispatched to least recently, then by id (issue 33 item 1,
docs/fleet-scheduling.md#ties-spread); held-back nodes last; a loading node only when no other
owner is there. A pure function: table tests, then properties."""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvpair.control.routing import Plan, Standing, Tier, fleet_plan, tier
from nvpair.control.state import Node
from nvpair.engines.loadstate import UNKNOWN, LoadState

M = "m"


def owner(node_id: str, *models: str) -> Node:
    listed = models or (M,)
    return Node(node_id, False, f"http://{node_id}", listed, frozenset(listed))


WARM = LoadState(warm=frozenset({M}))
COLD = LoadState(warm=frozenset({"other"}))
LOADING = LoadState(loading=True)


def llama(slots: int, busy: int) -> LoadState:
    return LoadState(warm_all=True, slots=slots, busy=busy)


def planned(
    nodes: Mapping[str, Standing | LoadState],
    *,
    pin: str | None = None,
    model: str | None = M,
    reservations: Mapping[str, int] | None = None,
) -> Plan:
    standing = {
        node_id: value if isinstance(value, Standing) else Standing(value)
        for node_id, value in nodes.items()
    }
    return fleet_plan(
        [owner(node_id) for node_id in nodes],
        pin,
        model,
        lambda node_id: standing[node_id],
        reservations or {},
    )


def ids(plan: Plan) -> list[str]:
    return [node.id for node in plan.candidates]


@pytest.mark.parametrize(
    ("nodes", "reservations", "expected"),
    [
        pytest.param({"a": COLD, "b": WARM}, {}, ["b", "a"], id="warm-beats-lower-id"),
        pytest.param({"a": UNKNOWN, "b": WARM}, {}, ["b", "a"], id="unknown-counts-as-cold"),
        pytest.param(
            {"a": COLD, "b": WARM, "c": WARM}, {"b": 1}, ["c", "b", "a"], id="free-busy-cold"
        ),
        pytest.param({"a": WARM, "b": WARM}, {"a": 1, "b": 1}, ["a", "b"], id="busy-ties-by-id"),
        pytest.param(
            {"a": COLD, "b": COLD, "c": COLD}, {"a": 2, "b": 1}, ["c", "b", "a"], id="least-load"
        ),
        pytest.param(
            {"a": llama(4, 3), "b": llama(4, 1)}, {}, ["b", "a"], id="busy-slots-are-pressure"
        ),
        pytest.param(
            {"a": llama(2, 2), "b": COLD}, {}, ["a", "b"], id="all-slots-busy-still-beats-cold"
        ),
        pytest.param(
            {"a": llama(4, 0), "b": llama(4, 2)}, {"a": 3}, ["b", "a"], id="own-plus-busy"
        ),
        pytest.param({"a": COLD, "b": COLD}, {}, ["a", "b"], id="no-knowledge-is-id-order"),
        pytest.param(
            {"a": Standing(WARM, last_dispatch=2), "b": Standing(WARM, last_dispatch=1)},
            {},
            ["b", "a"],
            id="tie-to-least-recently-dispatched",
        ),
        pytest.param(
            {"a": Standing(WARM, last_dispatch=3), "b": Standing(WARM)},
            {},
            ["b", "a"],
            id="never-dispatched-before-dispatched",
        ),
        pytest.param(
            {"a": Standing(WARM, last_dispatch=1), "b": Standing(COLD)},
            {},
            ["a", "b"],
            id="recency-never-beats-tier",
        ),
        pytest.param(
            {"a": Standing(WARM, last_dispatch=5), "b": Standing(WARM, last_dispatch=1)},
            {"b": 1},
            ["a", "b"],
            id="recency-never-beats-load",
        ),
        pytest.param(
            {"a": Standing(WARM, held=True), "b": Standing(WARM, held=True, last_dispatch=1)},
            {},
            ["a", "b"],
            id="held-back-tie-alike",
        ),
    ],
)
def test_order(
    nodes: Mapping[str, LoadState | Standing],
    reservations: Mapping[str, int],
    expected: list[str],
) -> None:
    plan = planned(nodes, reservations=reservations)
    assert ids(plan) == expected
    assert plan.reserve == expected[0] and not plan.pinned


def test_tiers() -> None:
    node = owner("a")
    assert tier(node, M, WARM, 0) is Tier.WARM_FREE
    assert tier(node, M, WARM, 1) is Tier.WARM_BUSY
    assert tier(node, M, COLD, 0) is Tier.COLD
    assert tier(node, M, UNKNOWN, 0) is Tier.COLD
    assert tier(node, M, LOADING, 0) is Tier.COLD


def test_a_loading_node_is_left_out_while_another_owner_is_there() -> None:
    assert ids(planned({"a": LOADING, "b": COLD})) == ["b"]
    held = Standing(COLD, held=True)
    assert ids(planned({"a": LOADING, "b": held})) == ["b"]


def test_loading_nodes_stay_when_every_owner_is_loading() -> None:
    plan = planned({"a": LOADING, "b": LOADING}, reservations={"a": 1})
    assert ids(plan) == ["b", "a"] and plan.reserve == "b"


def test_held_back_nodes_go_last_but_stay_candidates() -> None:
    nodes = {"a": Standing(WARM, held=True), "b": Standing(COLD), "c": Standing(WARM)}
    assert ids(planned(nodes)) == ["c", "b", "a"]
    everyone_held = {"a": Standing(COLD, held=True), "b": Standing(WARM, held=True)}
    plan = planned(everyone_held)
    assert ids(plan) == ["b", "a"] and plan.reserve == "b"


def test_an_eligible_pin_leads_and_takes_no_reservation() -> None:
    plan = planned({"a": WARM, "b": Standing(LOADING, held=True)}, pin="b")
    assert ids(plan) == ["b", "a"] and plan.pinned and plan.reserve is None
    # A pin that is no owner is ignored.
    plan = planned({"a": COLD, "b": WARM}, pin="z")
    assert ids(plan) == ["b", "a"] and not plan.pinned and plan.reserve == "b"


def test_a_model_less_request_is_warm_wherever_anything_is_loaded() -> None:
    assert ids(planned({"a": LoadState(warm=frozenset()), "b": COLD}, model=None)) == ["b", "a"]


def test_no_owner_no_plan() -> None:
    plan = planned({})
    assert plan.candidates == () and plan.reserve is None


# -- properties -----------------------------------------------------------------------------------

load_states = st.one_of(
    st.just(UNKNOWN),
    st.just(LOADING),
    st.builds(LoadState, warm=st.frozensets(st.sampled_from([M, "other"]))),
    st.builds(
        lambda slots, busy: LoadState(warm_all=True, slots=slots, busy=min(busy, slots)),
        st.integers(1, 8),
        st.integers(0, 8),
    ),
)
fleets = st.dictionaries(
    st.text("abcdefgh", min_size=1, max_size=3),
    # Load, held back, reservations, last dispatch (0: never).
    st.tuples(load_states, st.booleans(), st.integers(0, 5), st.integers(0, 3)),
    max_size=8,
)


Fleet = Mapping[str, tuple[LoadState, bool, int, int]]


def rank_of(plan: Plan, states: Fleet) -> list[tuple[bool, Tier, int, int, str]]:
    ranks = []
    for node in plan.candidates[1:] if plan.pinned else plan.candidates:
        load, held, reserved, last = states[node.id]
        ranks.append((held, tier(node, M, load, reserved), reserved + load.busy, last, node.id))
    return ranks


def plan_for(states: Fleet, pin: str | None, order: list[str]) -> Plan:
    return fleet_plan(
        [owner(node_id) for node_id in order],
        pin,
        M,
        lambda node_id: Standing(states[node_id][0], states[node_id][1], states[node_id][3]),
        {node_id: reserved for node_id, (_, _, reserved, _) in states.items() if reserved},
    )


@given(fleet=fleets, pin=st.none() | st.text("abcdefgh", min_size=1, max_size=3), data=st.data())
def test_properties(fleet: Fleet, pin: str | None, data: st.DataObject) -> None:
    order = data.draw(st.permutations(sorted(fleet)))
    plan = plan_for(fleet, pin, order)
    chosen = ids(plan)
    # Never broadens, never repeats; deterministic whatever order the snapshot lists owners.
    assert len(set(chosen)) == len(chosen) and set(chosen) <= set(fleet)
    assert plan == plan_for(fleet, pin, sorted(fleet))
    # The pin leads when it is an owner; the first behind it is the one reserved.
    assert plan.pinned == (pin in fleet)
    if plan.pinned:
        assert chosen[0] == pin and plan.reserve is None
    else:
        assert plan.reserve == (chosen[0] if chosen else None)
    rest = [node_id for node_id in fleet if node_id != pin]
    loading = {node_id for node_id in rest if fleet[node_id][0].loading}
    if plan.pinned or len(loading) < len(rest):
        # A loading node only when every owner is loading; every other owner stays.
        assert set(chosen) - {pin} == set(rest) - loading
    else:
        assert set(chosen) == set(rest)
    # Sorted: not held before held, then tier, then load, then last dispatch, then id.
    ranks = rank_of(plan, fleet)
    assert ranks == sorted(ranks)


@given(fleet=fleets)
def test_a_node_that_warms_up_never_moves_back(fleet: Fleet) -> None:
    """Putting the model in memory on one node (all else equal) never moves it later."""
    for node_id, (load, held, reserved, last) in fleet.items():
        if load.loading:
            continue
        before = ids(plan_for(fleet, None, sorted(fleet))).index(node_id)
        hot = attrs.evolve(load, warm=(load.warm or frozenset()) | {M})
        warmed = {**fleet, node_id: (hot, held, reserved, last)}
        after = ids(plan_for(warmed, None, sorted(warmed))).index(node_id)
        assert after <= before


# -- dispatched is loading (docs/fleet-scheduling.md#dispatched-is-loading) -----------------------


def test_a_node_loading_the_model_for_this_proxy_ranks_as_in_memory() -> None:
    """``b`` was just sent a request for m (reserved 1, no poll since): in memory but busy, it
    goes after a free warm node and before a cold one, a loading engine and a held-back node
    keep their places."""
    sent = COLD.assuming({M})
    nodes: dict[str, Standing | LoadState] = {
        "a": COLD,
        "b": sent,
        "c": WARM,
        "d": Standing(WARM, held=True),
    }
    assert ids(planned(nodes, reservations={"b": 1})) == ["c", "b", "a", "d"]
    assert ids(planned({"a": LOADING.assuming({M}), "b": COLD})) == ["b"]
    assert ids(planned({"a": COLD, "b": sent}, pin="a", reservations={"b": 1})) == ["a", "b"]


@given(fleet=fleets)
def test_a_dispatch_never_moves_its_node_back(fleet: Fleet) -> None:
    """Counting a dispatched model in memory on one node (all else equal) never moves that
    node later, and the order's rules hold for the assumed states as for polled ones."""
    for node_id, (load, held, reserved, last) in fleet.items():
        before = ids(plan_for(fleet, None, sorted(fleet)))
        assumed = {**fleet, node_id: (load.assuming({M}), held, reserved, last)}
        plan = plan_for(assumed, None, sorted(assumed))
        after = ids(plan)
        if node_id in before:
            assert after.index(node_id) <= before.index(node_id)
        assert rank_of(plan, assumed) == sorted(rank_of(plan, assumed))
        assert set(after) == set(before)
