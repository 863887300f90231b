"""Affinity's pure parts (docs/fleet-scheduling.md#conversations-go-where-their-cache-is): the
bounded prefix table, the cache ledger's correction, and the order's rules — the conversation's
node first only when warm, in the best tier and within the slack."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from nvpair.control.affinity import (
    DEFAULT_AFFINITY,
    MIN_ROUTED_SHARE,
    ROUTED_WINDOW,
    SHARE_WINDOW,
    SUSPENSION,
    AffinityOptions,
    CacheLedger,
    PrefixTable,
    scope,
)
from nvpair.control.routing import Affine, Standing, fleet_plan
from nvpair.control.state import Node
from nvpair.engines.conversation import prefix_keys
from nvpair.engines.inferstats import Stats
from nvpair.engines.loadstate import LoadState
from nvpair.fleet.health import HealthPolicy
from nvpair.fleet.scheduling import FleetScheduler

ENGINE = "llamacpp"


def node(node_id: str, engine: str = ENGINE) -> Node:
    return Node(node_id, False, f"http://{node_id}", ("m",), frozenset({"m"}), engine=engine)


A, B, C = node("a"), node("b"), node("c")
EVERYONE = lambda _: True  # noqa: E731


# -- the table ------------------------------------------------------------------------------------


def test_the_longest_known_key_names_the_node() -> None:
    table = PrefixTable()
    within = scope(ENGINE, "m")
    table.record(within, (1, 2), ENGINE, "a")
    table.record(within, (1, 2, 3, 4), ENGINE, "b")
    assert table.owner(within, (1, 2, 3, 4, 5, 6), EVERYONE) == ("b", 4)
    assert table.owner(within, (1, 9), EVERYONE) == ("b", 1)
    assert table.owner(within, (7,), EVERYONE) is None


def test_a_node_that_is_no_candidate_is_passed_over_for_a_shorter_key() -> None:
    table = PrefixTable()
    within = scope(ENGINE, "m")
    table.record(within, (1,), ENGINE, "a")
    table.record(within, (1, 2), ENGINE, "b")
    assert table.owner(within, (1, 2), lambda n: n != "b") is None  # key 1 is b's now too
    table.record(within, (5,), ENGINE, "a")
    table.record(within, (5, 6), ENGINE, "b")
    table.record(within, (5,), ENGINE, "a")
    assert table.owner(within, (5, 6), lambda n: n != "b") == ("a", 1)


def test_keys_of_one_model_or_engine_are_never_found_for_another() -> None:
    table = PrefixTable()
    table.record(scope(ENGINE, "m"), (1, 2), ENGINE, "a")
    assert table.owner(scope(ENGINE, "other"), (1, 2), EVERYONE) is None
    assert table.owner(scope("ollama", "m"), (1, 2), EVERYONE) is None
    assert table.owner(scope(ENGINE, "m"), (1, 2), EVERYONE) == ("a", 2)


def test_the_table_keeps_its_bound_least_recently_used_out() -> None:
    table = PrefixTable(bound=3)
    within = scope(ENGINE, "m")
    table.record(within, (1, 2), ENGINE, "a")
    table.record(within, (3,), ENGINE, "b")
    assert table.owner(within, (1,), EVERYONE) == ("a", 1)  # 1 is used: 2 is the oldest now
    table.record(within, (4,), ENGINE, "c")
    assert len(table) == 3
    assert table.owner(within, (2,), EVERYONE) is None
    assert table.owner(within, (1,), EVERYONE) == ("a", 1)
    table.record(within, tuple(range(100, 200)), ENGINE, "a")
    assert len(table) == 3
    with pytest.raises(ValueError):
        PrefixTable(bound=0)


# -- the ledger -----------------------------------------------------------------------------------


def test_one_miss_changes_nothing_and_a_cache_that_keeps_nothing_is_suspended() -> None:
    ledger = CacheLedger()
    ledger.reported(ENGINE, "a", 1000, 0, routed=True, now=0.0)
    assert not ledger.suspended(ENGINE, "a", 0.0)
    for n in range(ROUTED_WINDOW - 2):
        ledger.reported(ENGINE, "a", 1000, 200, routed=True, now=float(n))
    assert not ledger.suspended(ENGINE, "a", 100.0)
    ledger.reported(ENGINE, "a", 1000, 200, routed=True, now=100.0)  # the 20th: 19 % found
    assert ledger.suspended(ENGINE, "a", 100.0)
    share = ledger.share(ENGINE, "a", 100.0)
    assert share is not None and share.suspended_until == 100.0 + SUSPENSION
    assert ledger.suspended(ENGINE, "a", 100.0 + SUSPENSION - 0.1)
    # Ten minutes on it is tried again, from an empty window.
    assert not ledger.suspended(ENGINE, "a", 100.0 + SUSPENSION)
    ledger.reported(ENGINE, "a", 1000, 0, routed=True, now=800.0)
    assert not ledger.suspended(ENGINE, "a", 800.0)


def test_a_cache_that_keeps_a_quarter_is_not_suspended_and_plain_answers_do_not_count() -> None:
    ledger = CacheLedger()
    for n in range(ROUTED_WINDOW * 3):
        ledger.reported(ENGINE, "a", 1000, int(1000 * MIN_ROUTED_SHARE), routed=True, now=n)
        ledger.reported(ENGINE, "b", 1000, 0, routed=False, now=n)
    assert not ledger.suspended(ENGINE, "a", 100.0)
    assert not ledger.suspended(ENGINE, "b", 100.0)


def test_the_share_is_over_the_last_200_answers_that_said() -> None:
    ledger = CacheLedger()
    assert ledger.share(ENGINE, "a", 0.0) is None
    for _ in range(SHARE_WINDOW):
        ledger.reported(ENGINE, "a", 100, 0, routed=False, now=0.0)
    for _ in range(SHARE_WINDOW // 2):
        ledger.reported(ENGINE, "a", 100, 100, routed=False, now=0.0)
    ledger.reported(ENGINE, "a", 0, 0, routed=False, now=0.0)  # nothing read: not counted
    ledger.reported(ENGINE, "a", 10, 50, routed=False, now=0.0)  # more cached than read: all
    share = ledger.share(ENGINE, "a", 0.0)
    assert share is not None
    assert share.answers == SHARE_WINDOW
    assert share.prompt_tokens == 100 * (SHARE_WINDOW - 1) + 10
    assert share.share == pytest.approx((100 * 100 + 10) / share.prompt_tokens)
    ledger.forget(ENGINE, "a")
    assert ledger.share(ENGINE, "a", 0.0) is None


# -- the order ------------------------------------------------------------------------------------


def standing(**loads: LoadState) -> dict[str, Standing]:
    return {name: Standing(load) for name, load in loads.items()}


WARM_FREE = LoadState(warm_all=True, slots=2)


def order(
    states: dict[str, Standing],
    affine: str | None,
    reservations: dict[str, int] | None = None,
    slack: int = 2,
    pin: str | None = None,
    nodes: tuple[Node, ...] = (A, B, C),
) -> tuple[list[str], str | None, str | None]:
    plan = fleet_plan(
        nodes,
        pin,
        "m",
        lambda n: states.get(n, Standing()),
        reservations or {},
        None if affine is None else Affine(ENGINE, affine, slack),
    )
    return [n.id for n in plan.candidates], plan.affine, plan.reserve


def test_the_conversations_node_goes_first_among_warm_free_owners() -> None:
    states = standing(a=WARM_FREE, b=WARM_FREE, c=WARM_FREE)
    assert order(states, None) == (["a", "b", "c"], None, "a")
    assert order(states, "c") == (["c", "a", "b"], "c", "c")
    # Within the slack: c has two in flight, a none.
    assert order(states, "c", {"c": 1}) == (["c", "a", "b"], "c", "c")
    busier = LoadState(warm_all=True, slots=4)
    states = standing(a=WARM_FREE, b=WARM_FREE, c=busier)
    assert order(states, "c", {"c": 2}, slack=2)[0][0] == "c"
    assert order(states, "c", {"c": 3}, slack=2) == (["a", "b", "c"], None, "a")
    assert order(states, "c", {"c": 1}, slack=0) == (["a", "b", "c"], None, "a")


def test_tiers_and_pins_come_before_the_conversation() -> None:
    cold = LoadState(warm=frozenset())
    # c's slots are all busy while a has one free: a free slot wins.
    states = standing(a=WARM_FREE, b=WARM_FREE, c=WARM_FREE)
    assert order(states, "c", {"c": 2})[1] is None
    # c must load the model: warm wins.
    assert order(standing(a=WARM_FREE, b=WARM_FREE, c=cold), "c")[1] is None
    # Every owner cold: no affinity (there is no cache to go back to).
    assert order(standing(a=cold, b=cold, c=cold), "c")[1] is None
    # Held back: last, whatever it served.
    held = {"a": Standing(WARM_FREE), "b": Standing(WARM_FREE), "c": Standing(WARM_FREE, True)}
    assert order(held, "c")[1] is None
    # A pin stays first; the conversation's node is next, and nothing is reserved.
    states = standing(a=WARM_FREE, b=WARM_FREE, c=WARM_FREE)
    assert order(states, "c", pin="b") == (["b", "c", "a"], "c", None)
    # The node is no owner this round.
    assert order(states, "d") == (["a", "b", "c"], None, "a")


def test_across_engines_the_node_is_named_with_its_engine() -> None:
    a_ollama = node("a", "ollama")
    states = standing(a=WARM_FREE)
    plan = fleet_plan((A, a_ollama), None, "m", lambda n: states[n], {}, Affine("ollama", "a", 2))
    assert plan.candidates[0] is a_ollama and plan.affine == "a"


# -- the scheduler --------------------------------------------------------------------------------


def scheduler(clock: Clock, affinity: AffinityOptions = DEFAULT_AFFINITY) -> FleetScheduler:
    fleet = FleetScheduler(clock, HealthPolicy(3, 5.0, 120.0), affinity=affinity)
    for n in (A, B, C):
        fleet.record_load(ENGINE, n.id, WARM_FREE)
    return fleet


def turn(*messages: str) -> tuple[int, ...]:
    return prefix_keys({"messages": [{"role": "user", "content": m} for m in messages]})


def stats(prompt: int, cached: int) -> Stats:
    return Stats(prompt, 8, None, None, False, cached)


def test_the_next_turn_goes_where_the_last_one_was_served() -> None:
    clock = Clock()
    fleet = scheduler(clock)
    first = turn("hello")
    assert fleet.plan(ENGINE, (A, B, C), None, "m", {}, first).affine is None
    fleet.answered(ENGINE, "b", "m", first, stats(100, 0), affine=False)
    plan = fleet.plan(ENGINE, (A, B, C), None, "m", {}, turn("hello", "reply", "more"))
    assert plan.candidates[0].id == "b" and plan.affine == "b" and plan.reserve == "b"
    # Another model's conversation with the same text is not this one.
    assert fleet.plan(ENGINE, (A, B, C), None, "n", {}, turn("hello", "x")).affine is None


def test_off_the_order_is_the_plain_one_and_nothing_is_recorded() -> None:
    clock = Clock()
    fleet = scheduler(clock, AffinityOptions(enabled=False))
    assert fleet.prefix_of({"messages": [{"content": "x"}]}) == ()
    fleet.answered(ENGINE, "b", "m", turn("hello"), stats(100, 0), affine=False)
    assert len(fleet.table) == 0
    plan = fleet.plan(ENGINE, (A, B, C), None, "m", {}, turn("hello", "r", "m"))
    assert [n.id for n in plan.candidates] == ["a", "b", "c"] and plan.affine is None
    # Turned on by a reload it records from then on; turned off again it forgets.
    fleet.reconfigure(AffinityOptions())
    fleet.answered(ENGINE, "b", "m", turn("hello"), stats(100, 0), affine=False)
    assert fleet.plan(ENGINE, (A, B, C), None, "m", {}, turn("hello", "r")).affine == "b"
    fleet.reconfigure(AffinityOptions(enabled=False))
    assert len(fleet.table) == 0


def test_a_node_whose_cache_keeps_nothing_is_skipped_for_ten_minutes() -> None:
    clock = Clock()
    fleet = scheduler(clock)
    keys = turn("hello")
    fleet.answered(ENGINE, "c", "m", keys, None, affine=False)
    for _ in range(ROUTED_WINDOW):
        assert fleet.plan(ENGINE, (A, B, C), None, "m", {}, keys).affine == "c"
        fleet.answered(ENGINE, "c", "m", keys, stats(500, 20), affine=True)
    assert fleet.plan(ENGINE, (A, B, C), None, "m", {}, keys).affine is None
    share = fleet.caches.share(ENGINE, "c", clock.seconds())
    assert share is not None and share.suspended_until == SUSPENSION
    clock.advance(SUSPENSION)
    assert fleet.plan(ENGINE, (A, B, C), None, "m", {}, keys).affine == "c"


def test_the_openai_facades_round_takes_the_longest_match_over_engines() -> None:
    clock = Clock()
    fleet = scheduler(clock)
    a_ollama = node("a", "ollama")
    fleet.record_load("ollama", "a", LoadState(warm=frozenset({"m"})))
    fleet.answered(ENGINE, "c", "m", turn("x"), None, affine=False)
    fleet.answered("ollama", "a", "m", turn("x", "y"), None, affine=False)
    plan = fleet.plan_across((A, a_ollama, C), lambda engine: "m", {}, turn("x", "y", "z"))
    assert plan.candidates[0] is a_ollama


class _SummingLedger:
    """The suspension rule as written first: the routed window summed anew at every answer."""

    def __init__(self) -> None:
        self.routed: deque[tuple[int, int]] = deque(maxlen=ROUTED_WINDOW)
        self.until: float | None = None

    def reported(self, prompt: int, cached: int, routed: bool, now: float) -> None:
        if prompt <= 0:
            return
        cached = max(0, min(cached, prompt))
        if not routed or self.suspended(now):
            return
        self.routed.append((prompt, cached))
        if len(self.routed) == ROUTED_WINDOW:
            total = sum(tokens for tokens, _ in self.routed)
            found = sum(hits for _, hits in self.routed)
            if found < MIN_ROUTED_SHARE * total:
                self.until = now + SUSPENSION
                self.routed.clear()

    def suspended(self, now: float) -> bool:
        if self.until is None:
            return False
        if now < self.until:
            return True
        self.until = None
        return False


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=-5, max_value=2000),
            st.integers(min_value=-5, max_value=2500),
            st.booleans(),
            st.sampled_from([0.0, 1.0, 30.0, SUSPENSION]),
        ),
        max_size=120,
    )
)
def test_the_routed_window_kept_as_running_sums_suspends_as_summing_it_did(
    answers: list[tuple[int, int, bool, float]],
) -> None:
    ledger, reference = CacheLedger(), _SummingLedger()
    now = 0.0
    for prompt, cached, routed, step in answers:
        now += step
        ledger.reported(ENGINE, "a", prompt, cached, routed=routed, now=now)
        reference.reported(prompt, cached, routed, now)
        assert ledger.suspended(ENGINE, "a", now) == reference.suspended(now)
