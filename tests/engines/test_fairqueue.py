"""The fleet queue's pure decisions (docs/fleet-scheduling.md#the-queue): capacity, turns,
collation, and a property test over random arrivals, leavings, completions and capacity changes
that holds them to docs/fleet-scheduling.md#the-queue (issue 30 item 2)."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from nvpair.control.fairqueue import (
    Ledger,
    NodeId,
    Option,
    Turns,
    Waiter,
    capacity,
    pump,
)
from nvpair.engines.caller import Priority
from nvpair.engines.loadstate import UNKNOWN, LoadState


def test_capacity_is_what_the_engine_says_else_the_fleet_file_else_its_default() -> None:
    assert capacity("llamacpp", LoadState(slots=2), "m", None) == 2
    router = LoadState(model_slots=(("a", 3, 1),))
    assert capacity("llamacpp", router, "a", 8) == 3
    assert capacity("llamacpp", UNKNOWN, "m", None) == 4
    assert capacity("ollama", UNKNOWN, "m", None) == 1
    assert capacity("ollama", UNKNOWN, "m", 4) == 4
    assert capacity("lmstudio", UNKNOWN, "m", None) == 4


def test_a_cold_model_starts_only_on_a_drained_node() -> None:
    ledger = Ledger(lambda node: UNKNOWN, lambda node: 4)
    node: NodeId = ("ollama", "a")
    warm, cold = Option(node, "m", True), Option(node, "n", False)
    assert ledger.startable(cold)
    ledger.take(warm)
    assert ledger.startable(warm) and not ledger.startable(cold)
    ledger.give_back(warm)
    assert ledger.startable(cold)


def test_others_busy_slots_count_against_llamacpp_capacity() -> None:
    load = LoadState(slots=2, busy=1)
    ledger = Ledger(lambda node: load, lambda node: None)
    option = Option(("llamacpp", "a"), "m", True)
    assert ledger.startable(option)
    ledger.take(option)
    assert not ledger.startable(option)


def test_callers_take_turns_then_arrival_within_a_caller() -> None:
    """A burst of one caller does not hold back another's single request."""
    node = Option(("llamacpp", "a"), "m", True)
    ledger = Ledger(lambda n: LoadState(slots=1), lambda n: None)
    turns = Turns()
    burst = [Waiter(i, 0.0, "batch") for i in range(5)]
    chat = Waiter(5, 1.0, "alice")
    waiting = [*burst, chat]
    order: list[Waiter] = []
    for _ in range(6):
        granted = pump(waiting, lambda w: [node], ledger, turns, 10.0, 2.0)
        assert len(granted) == 1
        order.append(granted[0][0])
        waiting.remove(granted[0][0])
        ledger.give_back(node)
    assert [w.caller for w in order[:3]] == ["batch", "alice", "batch"]
    assert [w.seq for w in order if w.caller == "batch"] == [0, 1, 2, 3, 4]


def test_high_priority_goes_first() -> None:
    node = Option(("llamacpp", "a"), "m", True)
    ledger = Ledger(lambda n: LoadState(slots=1), lambda n: None)
    low = Waiter(0, 0.0, "batch", Priority.LOW)
    high = Waiter(1, 5.0, "boss", Priority.HIGH)
    granted = pump([low, high], lambda w: [node], ledger, Turns(), 10.0, 6.0)
    assert [w for w, _ in granted] == [high]


def test_a_node_serves_what_it_holds_before_it_swaps_for_at_most_collate() -> None:
    node: NodeId = ("ollama", "a")
    options = {"a-model": Option(node, "a", True), "b-model": Option(node, "b", False)}
    first = Waiter(0, 0.0, "x", group="b-model")
    second = Waiter(1, 1.0, "y", group="a-model")

    def of(waiter: Waiter) -> list[Option]:
        return [options[str(waiter.group)]]

    ledger = Ledger(lambda n: UNKNOWN, lambda n: 1)
    granted = pump([first, second], of, ledger, Turns(), 10.0, 5.0)
    assert [w for w, _ in granted] == [second]
    fresh = Ledger(lambda n: UNKNOWN, lambda n: 1)
    granted = pump([first, second], of, fresh, Turns(), 10.0, 10.0)
    # Waited collate: the load goes first; the held model's request is then startable too
    # (its own count is below its capacity), as far as the proxy can tell.
    assert [w for w, _ in granted][:1] == [first]


def test_a_saturated_fleet_asks_one_ordering_per_kind_of_waiter() -> None:
    """One slot frees with thirty alike waiting: the first in turn is granted it, and one more
    is asked to learn there is nothing else, not all twenty-nine (a fleet plan each)."""
    node = Option(("llamacpp", "a"), "m", True)
    ledger = Ledger(lambda n: LoadState(slots=4), lambda n: None)
    for _ in range(3):
        ledger.take(node)
    waiting = [Waiter(i, 0.0, "wrk", group="m") for i in range(30)]
    asked: list[Waiter] = []

    def options(waiter: Waiter) -> list[Option]:
        asked.append(waiter)
        return [node]

    granted = pump(waiting, options, ledger, Turns(), 10.0, 1.0, alike=lambda w: w.group)
    assert granted == [(waiting[0], node)]
    assert asked == waiting[:2]


def test_waiters_of_another_kind_are_still_asked() -> None:
    """A kind with nothing startable says nothing of another (a model on another node)."""
    full, free = Option(("llamacpp", "a"), "m", True), Option(("llamacpp", "b"), "n", True)
    ledger = Ledger(lambda n: LoadState(slots=1), lambda n: None)
    ledger.take(full)
    waiting = [Waiter(0, 0.0, "x", group="m"), Waiter(1, 0.0, "x", group="m")]
    waiting.append(Waiter(2, 0.0, "x", group="n"))
    of = {"m": [full], "n": [free]}
    granted = pump(
        waiting, lambda w: of[str(w.group)], ledger, Turns(), 10.0, 1.0, alike=lambda w: w.group
    )
    assert granted == [(waiting[2], free)]


# -- the property -------------------------------------------------------------------------------

NODES: list[NodeId] = [("ollama", "n0"), ("ollama", "n1"), ("llamacpp", "n2")]
MODELS = ["m0", "m1", "m2"]


class World:
    """Nodes holding some models, with a capacity each; waiters arriving, leaving, being
    served; the pure queue deciding."""

    def __init__(self, warm: dict[NodeId, set[str]], owners: dict[str, list[NodeId]]) -> None:
        self.warm = warm
        self.owners = owners
        self.parallel: dict[NodeId, int] = dict.fromkeys(NODES, 1)
        self.busy: dict[NodeId, int] = dict.fromkeys(NODES, 0)
        self.ledger = Ledger(self.load, lambda node: self.parallel[node])
        self.turns = Turns()
        self.waiting: list[Waiter] = []
        self.running: list[tuple[Waiter, Option]] = []
        self.now = 0.0
        self.seq = 0

    def load(self, node: NodeId) -> LoadState:
        if node[0] == "llamacpp":
            return LoadState(slots=self.parallel[node], busy=self.busy[node])
        return LoadState(busy=0)

    def options(self, waiter: Waiter) -> list[Option]:
        model = str(waiter.group)
        return [Option(n, model, model in self.warm[n]) for n in self.owners[model]]

    def step(self) -> None:
        """One pump, each of its grants checked in order against a copy of the state it was
        made in (an oracle phrased as the docs are, not as the code is)."""
        shadow, turns = copy.deepcopy(self.ledger), copy.deepcopy(self.turns)
        # The copy reads the world's loads and parallel settings, as the real ledger does.
        shadow._load, shadow._parallel = self.load, lambda node: self.parallel[node]
        pending = list(self.waiting)
        # Each waiter judged alone: what the pump grants when it asks every waiter.
        alone_ledger, alone_turns = copy.deepcopy(self.ledger), copy.deepcopy(self.turns)
        alone_ledger._load, alone_ledger._parallel = self.load, lambda node: self.parallel[node]
        alone = pump(self.waiting, self.options, alone_ledger, alone_turns, 10.0, self.now)
        # Waiters of one model have the same options here: judged by kind, the same grants.
        granted = pump(
            self.waiting,
            self.options,
            self.ledger,
            self.turns,
            10.0,
            self.now,
            alike=lambda waiter: waiter.group,
        )
        assert granted == alone
        for waiter, option in granted:
            assert waiter in pending
            # Never over capacity; a load only on a node with nothing of ours in flight.
            assert shadow.startable(option), (waiter, option)
            # Never a waiting request skipped by a later one of its caller and priority.
            for other in pending:
                same = (other.caller, other.priority, other.group) == (
                    waiter.caller,
                    waiter.priority,
                    waiter.group,
                )
                assert not (same and other.seq < waiter.seq), (waiter, other)
            # Whose turn it was: passed over only for a model the node holds, under collate.
            first = next(
                (
                    (w, o)
                    for w in sorted(pending, key=turns.key)
                    for o in [next((o for o in self.options(w) if shadow.startable(o)), None)]
                    if o is not None
                ),
                None,
            )
            assert first is not None
            if first[0] is not waiter:
                passed, its_option = first
                assert not its_option.warm and its_option.node == option.node
                assert option.warm and self.now - passed.since < 10.0
            shadow.take(option)
            turns.served(waiter.caller)
            pending.remove(waiter)
        # Nothing left that could start: the pump stops only when nobody can.
        assert not any(shadow.startable(o) for w in pending for o in self.options(w))
        for waiter, option in granted:
            self.waiting.remove(waiter)
            self.running.append((waiter, option))
            self.warm[option.node].add(str(option.model))


_EVENTS = st.lists(
    st.one_of(
        st.tuples(
            st.just("arrive"),
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from(list(Priority)),
            st.sampled_from(MODELS),
        ),
        st.tuples(st.just("leave"), st.integers(0, 20)),
        st.tuples(st.just("finish"), st.integers(0, 20)),
        st.tuples(st.just("parallel"), st.integers(0, 2), st.integers(1, 3)),
        st.tuples(st.just("busy"), st.integers(0, 2)),
        st.tuples(st.just("time"), st.floats(0.1, 15.0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    events=_EVENTS,
    warm=st.lists(st.sets(st.sampled_from(MODELS)), min_size=3, max_size=3),
    owners=st.lists(st.sets(st.integers(0, 2), min_size=1), min_size=3, max_size=3),
)
def test_the_queue_keeps_its_order_over_any_history(
    events: list[tuple[object, ...]], warm: list[set[str]], owners: list[set[int]]
) -> None:
    world = World(
        {node: set(models) for node, models in zip(NODES, warm, strict=True)},
        {model: [NODES[i] for i in sorted(o)] for model, o in zip(MODELS, owners, strict=True)},
    )
    for event in events:
        kind = event[0]
        if kind == "arrive":
            _, caller, priority, model = event
            world.waiting.append(
                Waiter(world.seq, world.now, str(caller), Priority(priority), str(model))  # type: ignore[arg-type]
            )
            world.seq += 1
        elif kind == "leave" and world.waiting:
            world.waiting.pop(int(event[1]) % len(world.waiting))  # type: ignore[call-overload]
        elif kind == "finish" and world.running:
            _, option = world.running.pop(int(event[1]) % len(world.running))  # type: ignore[call-overload]
            world.ledger.give_back(option)
        elif kind == "parallel":
            world.parallel[NODES[int(event[1])]] = int(event[2])  # type: ignore[call-overload]
        elif kind == "busy":
            node = NODES[int(event[1])]  # type: ignore[call-overload]
            world.busy[node] = (world.busy[node] + 1) % 2
        elif kind == "time":
            world.now += float(event[1])  # type: ignore[arg-type]
        world.step()
