"""Why a known conversation's node did not go first, and the verdict at a request's first
dispatch (issue 33 item 2; docs/fleet-scheduling.md#what-the-operator-sees-of-affinity): pure
values, then the scheduler on a Clock."""

from __future__ import annotations

from twisted.internet.task import Clock

from nvpair.control.affinity import (
    BUSIER,
    FOLLOWED,
    HELD_BACK,
    LEFT,
    MOVED,
    NEW,
    QUEUE,
    ROUTED_WINDOW,
    SUSPENDED,
    TIER,
    Conversation,
    Verdict,
    verdict,
)
from nvpair.control.routing import Affine, Standing, fleet_plan
from nvpair.control.state import Node
from nvpair.engines.conversation import prefix_keys
from nvpair.engines.inferstats import Stats
from nvpair.engines.loadstate import LoadState
from nvpair.fleet.health import HealthPolicy
from nvpair.fleet.scheduling import FleetScheduler

ENGINE = "llamacpp"
WARM = LoadState(warm=frozenset({"m"}), slots=1)
COLD = LoadState(warm=frozenset())
NODES = tuple(Node(n, False, f"http://{n}", ("m",), frozenset({"m"}), engine=ENGINE) for n in "abc")


def known(states: dict[str, Standing], reservations: dict[str, int]) -> Conversation | None:
    """What the plan says of a conversation served on ``a``."""
    plan = fleet_plan(
        NODES,
        None,
        "m",
        lambda n: states.get(n, Standing(WARM)),
        reservations,
        Affine(ENGINE, "a", 2),
    )
    return plan.conversation


def test_each_reason_the_conversations_node_is_passed_over() -> None:
    assert known({}, {}) == Conversation((ENGINE, "a"), None)
    many = LoadState(warm=frozenset({"m"}), slots=8)
    busy = {n: Standing(many) for n in "abc"}
    assert known(busy, {"a": 3}) == Conversation((ENGINE, "a"), BUSIER)
    assert known(busy, {"a": 2}) == Conversation((ENGINE, "a"), None)  # within the slack
    assert known({"a": Standing(COLD)}, {}) == Conversation((ENGINE, "a"), TIER)
    assert known({}, {"a": 1}) == Conversation((ENGINE, "a"), TIER)  # its one slot taken
    loading = LoadState(loading=True)
    assert known({"a": Standing(loading)}, {}) == Conversation((ENGINE, "a"), TIER)
    held = {"a": Standing(WARM, held=True)}
    assert known(held, {}) == Conversation((ENGINE, "a"), HELD_BACK)


def test_the_verdict_at_the_first_dispatch() -> None:
    assert verdict(Conversation(None), ENGINE, "b", LEFT) == Verdict(NEW)
    on_a = Conversation((ENGINE, "a"), TIER)
    assert verdict(on_a, ENGINE, "a", LEFT) == Verdict(FOLLOWED, None, "a")
    assert verdict(on_a, ENGINE, "b", LEFT) == Verdict(MOVED, TIER, "a")
    # Affinity put it first, yet the first dispatch went elsewhere.
    first = Conversation((ENGINE, "a"))
    assert verdict(first, ENGINE, "b", QUEUE) == Verdict(MOVED, QUEUE, "a")
    # The same node id under another engine is another owner.
    assert verdict(first, "ollama", "a", LEFT) == Verdict(MOVED, LEFT, "a")


def test_the_scheduler_says_new_suspended_or_nothing() -> None:
    clock = Clock()
    fleet = FleetScheduler(clock, HealthPolicy(3, 5.0, 60.0))
    for node in NODES:
        fleet.record_load(ENGINE, node.id, WARM)
    keys = prefix_keys({"messages": [{"role": "user", "content": "hi"}]})
    assert fleet.plan(ENGINE, NODES, None, "m", {}, keys).conversation == Conversation(None)
    # No keys (an embedding, a token array): nothing to say.
    assert fleet.plan(ENGINE, NODES, None, "m", {}, ()).conversation is None
    fleet.answered(ENGINE, "c", "m", keys, None, affine=False)
    plan = fleet.plan(ENGINE, NODES, None, "m", {}, keys)
    assert plan.conversation == Conversation((ENGINE, "c")) and plan.affine == "c"
    for _ in range(ROUTED_WINDOW):
        fleet.answered(ENGINE, "c", "m", keys, Stats(500, 1, None, None, False, 0), affine=True)
    plan = fleet.plan(ENGINE, NODES, None, "m", {}, keys)
    assert plan.conversation == Conversation((ENGINE, "c"), SUSPENDED) and plan.affine is None
