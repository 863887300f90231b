"""The fleet queue, live, on a Clock (docs/fleet-scheduling.md#the-queue): places given at
once or when freed, timeouts, a waiter that leaves, ``max-depth``, reloads and the pump that
runs while anything waits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from nvpair.control.fairqueue import NodeId, Option, QueueOptions
from nvpair.dispatch.queueing import PUMP_EVERY, FleetQueue, QueueFull
from nvpair.engines.caller import Priority
from nvpair.engines.loadstate import LoadState
from nvpair.fleet.health import HealthPolicy
from nvpair.fleet.scheduling import FleetScheduler

A: NodeId = ("llamacpp", "a")
B: NodeId = ("llamacpp", "b")


class Fleet:
    """Two llama.cpp nodes of one slot each, whose load a test sets."""

    def __init__(self, **options: object) -> None:
        self.clock = Clock()
        self.loads = {A: LoadState(slots=1), B: LoadState(slots=1)}
        self.queue = FleetQueue(self.clock, self.loads.__getitem__, QueueOptions(**options))  # type: ignore[arg-type]

    def ask(
        self, caller: str = "x", nodes: tuple[NodeId, ...] = (A,), until: float = 100.0
    ) -> tuple[Deferred[Option | None], list[Option | None]]:
        waiter = self.queue.waiter(caller, Priority.NORMAL, ("llamacpp", "m"))
        options = [self.queue.option(node, "m", frozenset({"m"})) for node in nodes]
        d = self.queue.take(waiter, lambda: options, until, alike=waiter)
        got: list[Option | None] = []
        d.addCallback(got.append)
        return d, got


def test_a_free_place_is_given_at_once_and_the_next_waits_for_it() -> None:
    fleet = Fleet()
    _, first = fleet.ask()
    assert first == [Option(A, "m", True)]
    _, second = fleet.ask()
    assert second == []
    fleet.queue.release(Option(A, "m", True))
    assert second == [Option(A, "m", True)]


def test_late_binding_the_first_owner_to_free_takes_the_waiter() -> None:
    fleet = Fleet()
    fleet.ask(nodes=(A,))
    fleet.ask(nodes=(B,))
    _, waiting = fleet.ask(nodes=(A, B))
    assert waiting == []
    fleet.queue.release(Option(B, "m", True))
    assert waiting == [Option(B, "m", True)]


def test_a_place_another_client_frees_is_found_by_the_pump_that_runs_while_anything_waits() -> None:
    fleet = Fleet()
    fleet.loads[A] = LoadState(slots=1, busy=1)  # another client's request
    _, waiting = fleet.ask()
    assert waiting == []
    fleet.loads[A] = LoadState(slots=1, busy=0)
    fleet.clock.advance(PUMP_EVERY)
    assert waiting == [Option(A, "m", True)]
    assert not fleet.clock.getDelayedCalls()


def test_waiting_ends_at_its_time_with_none() -> None:
    fleet = Fleet()
    fleet.ask()
    _, waiting = fleet.ask(until=30.0)
    fleet.clock.advance(29.9)
    assert waiting == []
    fleet.clock.advance(0.2)
    assert waiting == [None]
    assert fleet.queue.depth(("llamacpp", "m")) == 0


def test_a_waiter_that_leaves_is_taken_out_and_never_given_a_place() -> None:
    fleet = Fleet()
    fleet.ask()
    d, waiting = fleet.ask()
    d.addErrback(lambda failure: None)
    d.cancel()
    assert fleet.queue.depth(("llamacpp", "m")) == 0
    fleet.queue.release(Option(A, "m", True))
    assert waiting == [] and fleet.queue.ledger.in_flight(A) == 0
    _, third = fleet.ask()
    assert third == [Option(A, "m", True)]


def test_max_depth_refuses_one_more_waiter_but_never_a_request_with_a_free_place() -> None:
    fleet = Fleet(max_depth=2)
    fleet.ask()
    fleet.ask()
    fleet.ask()
    with pytest.raises(QueueFull):
        fleet.ask()
    # B is free: a request that can start there is never refused.
    _, got = fleet.ask(nodes=(A, B))
    assert got == [Option(B, "m", True)]


def test_a_reload_keeps_the_waiters_and_its_parallel_counts_at_once() -> None:
    fleet = Fleet()
    fleet.loads[A] = LoadState()  # says nothing of its slots: [nodes.parallel], else 4
    first = [fleet.ask(nodes=(A,)) for _ in range(4)]
    assert all(got for _, got in first)
    _, fifth = fleet.ask(nodes=(A,))
    assert fifth == []
    fleet.queue.reconfigure(QueueOptions(), {A: 5})
    assert fifth == [Option(A, "m", True)]


def test_a_cold_model_waits_for_its_node_to_drain() -> None:
    fleet = Fleet()
    fleet.loads[A] = LoadState(slots=4, warm=frozenset({"m"}))
    fleet.ask()
    waiter = fleet.queue.waiter("y", Priority.NORMAL, ("llamacpp", "n"))
    cold = fleet.queue.option(A, "n", frozenset({"m", "n"}))
    assert not cold.warm
    got: list[Option | None] = []
    fleet.queue.take(waiter, lambda: [cold], 100.0, alike=waiter).addCallback(got.append)
    assert got == []
    fleet.queue.release(Option(A, "m", True))
    assert got == [cold]


# -- the live queue over random histories, on a Clock -------------------------------------------

_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("ask"), st.sampled_from(["x", "y", "z"]), st.sampled_from([A, B])),
        st.tuples(st.just("leave"), st.integers(0, 30)),
        st.tuples(st.just("finish"), st.integers(0, 30)),
        st.tuples(st.just("busy"), st.sampled_from([A, B]), st.integers(0, 1)),
        st.tuples(st.just("advance"), st.floats(0.0, 40.0)),
    ),
    max_size=50,
)


@settings(max_examples=200, deadline=None)
@given(steps=_STEPS)
def test_the_live_queue_never_goes_over_capacity_and_every_waiter_ends(
    steps: list[tuple[object, ...]],
) -> None:
    """Whatever arrives, leaves, ends or is reported busy, and however time passes: no node
    runs more than its one slot, no waiter is left without an answer past its time, and a
    waiter that left is never given a place."""
    fleet = Fleet(max_wait=30.0)
    asked: list[tuple[Deferred[Option | None], list[Option | None]]] = []
    started: set[int] = set()
    running: list[Option] = []
    left: set[int] = set()
    for step in steps:
        kind = step[0]
        if kind == "ask":
            until = fleet.clock.seconds() + 30.0
            asked.append(fleet.ask(str(step[1]), (step[2],), until))  # type: ignore[arg-type]
        elif kind == "leave" and asked:
            index = int(step[1]) % len(asked)  # type: ignore[call-overload]
            d, got = asked[index]
            if not got:
                d.addErrback(lambda failure: None)
                d.cancel()
                left.add(index)
        elif kind == "finish" and running:
            fleet.queue.release(running.pop(int(step[1]) % len(running)))  # type: ignore[call-overload]
        elif kind == "busy":
            fleet.loads[step[1]] = LoadState(slots=1, busy=int(step[2]))  # type: ignore[index, call-overload]
            fleet.queue.pump()
        elif kind == "advance":
            fleet.clock.advance(float(step[1]))  # type: ignore[arg-type]
        for index, (_, got) in enumerate(asked):
            if index not in started and got and got[0] is not None:
                started.add(index)
                running.append(got[0])
        for node in (A, B):
            assert fleet.queue.ledger.in_flight(node) <= 1
            assert fleet.queue.ledger.in_flight(node) == sum(o.node == node for o in running)
    fleet.clock.advance(31.0)
    for index, (_, got) in enumerate(asked):
        assert got == [] if index in left else len(got) == 1


def test_a_box_that_swapped_is_not_sent_the_model_it_swapped_out() -> None:
    """An Ollama box seen holding one model at a time, with the queue reading its load as the
    fleet scheduler stands it: a request for a second model loads it there (the box had none
    of the proxy's requests), and a request for the first then waits for that one to end —
    the box no longer holds it — instead of starting beside it and swapping back."""
    clock = Clock()
    scheduler = FleetScheduler(clock, HealthPolicy(3, 5.0, 120.0))
    box: NodeId = ("ollama", "a")
    scheduler.record_load(*box, LoadState(warm=frozenset({"m"})), asked_at=0.0)
    clock.advance(5.0)
    queue = FleetQueue(clock, lambda node: scheduler.standing(*node).load)
    listed = frozenset({"m", "n"})

    def ask(model: str) -> list[Option | None]:
        waiter = queue.waiter("x", Priority.NORMAL, ("ollama", model))
        got: list[Option | None] = []
        queue.take(
            waiter, lambda: [queue.option(box, model, listed)], 100.0, alike=waiter
        ).addCallback(got.append)
        return got

    loading = ask("n")
    assert loading == [Option(box, "n", False)]
    scheduler.dispatched(*box, "n")
    swapped_out = ask("m")
    assert swapped_out == []
    queue.release(Option(box, "n", False))
    assert swapped_out == [Option(box, "m", False)]
