"""The fleet queue, live, on a Clock (docs/fleet-scheduling.md#the-queue): places given at
once or when freed, timeouts, a waiter that leaves, ``max-depth``, reloads and the pump that
runs while anything waits."""

from __future__ import annotations

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from nvpair.control.fairqueue import NodeId, Option, QueueOptions
from nvpair.dispatch.queueing import PUMP_EVERY, FleetQueue, QueueFull
from nvpair.engines.caller import Priority
from nvpair.engines.loadstate import LoadState

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
        d = self.queue.take(waiter, lambda: options, until)
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
    fleet.queue.take(waiter, lambda: [cold], 100.0).addCallback(got.append)
    assert got == []
    fleet.queue.release(Option(A, "m", True))
    assert got == [cold]
