"""Whatever the sequence of requests, loads and cache reports, affinity never breaks fleet
mode's order (issue 23 item 5; docs/fleet-scheduling.md#affinity-order): the first candidate
is an owner in the best tier there is, never more than ``affinity-slack`` busier than the
least-loaded warm owner, and the prefix table never exceeds its bound. Where affinity chose
none, the first candidate is, among the owners equal to it in standing, tier and load, the
one this proxy dispatched to least recently, then the first by node id (issue 33 item 1;
docs/fleet-scheduling.md#ties-spread)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from nvpair.control.affinity import AffinityOptions, PrefixTable
from nvpair.control.routing import Tier, fleet_load, fleet_plan, tier
from nvpair.control.state import Node
from nvpair.engines.conversation import prefix_keys
from nvpair.engines.inferstats import Stats
from nvpair.engines.loadstate import LoadState
from nvpair.fleet.health import HealthPolicy
from nvpair.fleet.scheduling import FleetScheduler

ENGINE = "llamacpp"
IDS = ("a", "b", "c", "d")
BOUND = 40

#: Held back, tier, estimated load.
Rank3 = tuple[bool, Tier, int]

loads = st.builds(
    LoadState,
    loading=st.sampled_from((False,) * 5 + (True,)),
    warm=st.sampled_from((frozenset({"m"}),) * 4 + (None, frozenset())),
    slots=st.one_of(st.none(), st.integers(1, 4)),
    busy=st.integers(0, 3),
)
operations = st.lists(
    st.one_of(
        # A turn of one of a few conversations, with this proxy's requests on each node.
        st.tuples(
            st.just("request"),
            st.integers(0, 3),
            st.integers(1, 8),
            st.dictionaries(st.sampled_from(IDS), st.integers(0, 3)),
        ),
        st.tuples(
            st.just("load"), st.sampled_from(IDS), loads, st.sampled_from((False,) * 5 + (True,))
        ),
        st.tuples(st.just("report"), st.sampled_from(IDS), st.integers(0, 500), st.booleans()),
        st.tuples(st.just("time"), st.floats(0, 700)),
    ),
    max_size=60,
)


def owners(count: int) -> tuple[Node, ...]:
    return tuple(
        Node(node_id, False, f"http://{node_id}", ("m",), frozenset({"m"}), engine=ENGINE)
        for node_id in IDS[:count]
    )


def conversation(number: int, turns: int) -> tuple[int, ...]:
    messages = [{"role": "user", "content": f"{number}:{t}"} for t in range(turns)]
    return prefix_keys({"messages": messages})


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.integers(0, 3), operations)
def test_affinity_never_breaks_the_tiers_nor_the_slack_nor_the_bound(
    count: int, slack: int, ops: list[tuple[object, ...]]
) -> None:
    clock = Clock()
    fleet = FleetScheduler(
        clock,
        HealthPolicy(2, 5.0, 60.0),
        affinity=AffinityOptions(True, slack),
        table=PrefixTable(BOUND),
    )
    nodes = owners(count)
    for each in nodes:
        fleet.record_load(ENGINE, each.id, LoadState(warm=frozenset({"m"}), slots=4))
    for op in ops:
        kind = op[0]
        if kind == "load":
            _, node_id, load, failed = op
            assert isinstance(node_id, str) and isinstance(load, LoadState)
            fleet.record_load(ENGINE, node_id, load)
            if failed:
                fleet.failed(ENGINE, node_id, False, "transport")
        elif kind == "report":
            _, node_id, cached, routed = op
            assert isinstance(node_id, str) and isinstance(cached, int)
            fleet.answered(
                ENGINE, node_id, "m", (), Stats(500, 1, None, None, False, cached), bool(routed)
            )
        elif kind == "time":
            clock.advance(float(op[1]))  # type: ignore[arg-type]
        else:
            _, number, turns, reservations = op
            assert isinstance(number, int) and isinstance(turns, int)
            assert isinstance(reservations, dict)
            keys = conversation(number, turns)
            plan = fleet.plan(ENGINE, nodes, None, "m", reservations, keys)
            plain = fleet_plan(nodes, None, "m", lambda n: fleet.standing(ENGINE, n), reservations)
            assert {n.id for n in plan.candidates} == {n.id for n in plain.candidates}
            first = plan.candidates[0]
            assert first in nodes

            def rank(candidate: Node, reservations: dict[str, int] = reservations) -> Rank3:
                state = fleet.standing(ENGINE, candidate.id)
                reserved = reservations.get(candidate.id, 0)
                return (
                    state.held,
                    tier(candidate, "m", state.load, reserved),
                    fleet_load(state.load, reserved),
                )

            chosen, best = rank(first), rank(plain.candidates[0])
            assert chosen[:2] == best[:2]  # the best tier there is
            if plan.affine is not None:
                assert first.id == plan.affine and chosen[1] is not Tier.COLD
                warm = [rank(n)[2] for n in nodes if not rank(n)[0] and rank(n)[1] < Tier.COLD]
                assert chosen[2] <= min(warm) + slack
            else:
                assert plan.candidates == plain.candidates
                # Ties spread: of the owners that rank as the first does, none was dispatched
                # to less recently, and of those dispatched to as long ago, none has a lower id.
                equal = [n for n in nodes if rank(n) == chosen]
                last = {n.id: fleet.standing(ENGINE, n.id).last_dispatch for n in equal}
                assert last[first.id] == min(last.values())
                assert first.id == min(i for i in last if last[i] == last[first.id])
            # The request is sent to the first candidate: it is now the most recent dispatch.
            fleet.dispatching(ENGINE, first.id, "m")
            assert fleet.standing(ENGINE, first.id).last_dispatch == max(
                fleet.standing(ENGINE, n.id).last_dispatch for n in nodes
            )
            # The node answers: its keys are recorded, its cache may say anything.
            fleet.answered(
                ENGINE,
                first.id,
                "m",
                keys,
                Stats(400, 1, None, None, False, turns * 13 % 400),
                plan.affine is not None,
            )
        assert len(fleet.table) <= BOUND
