"""Passive health in fleet mode (docs/fleet-scheduling.md#passive-health, issue 13 item 3): the
state machine as a pure value, and on a Clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.logger import capturedLogs

from nvpair.fleet.health import HEALTHY, HealthPolicy, NodeHealth, PassiveHealth

POLICY = HealthPolicy(threshold=3, cooldown=5.0, cooldown_max=120.0)


def test_cooldowns_double_up_to_the_cap() -> None:
    assert [POLICY.cooldown_for(n) for n in range(1, 9)] == [5, 10, 20, 40, 80, 120, 120, 120]
    assert HealthPolicy(3, 0.0, 0.0).cooldown_for(4) == 0
    # A huge streak neither overflows nor loops for long.
    assert POLICY.cooldown_for(10**9) == 120


def test_fewer_failures_than_the_threshold_hold_nothing_back() -> None:
    health = HEALTHY.failed(0, POLICY, trial=False).failed(1, POLICY, trial=False)
    assert health.failures == 2 and not health.held(1)


def test_the_threshold_holds_a_node_back_for_one_cooldown() -> None:
    health = HEALTHY
    for t in range(3):
        health = health.failed(float(t), POLICY, trial=False)
    assert health == NodeHealth(failures=3, holds=1, held_until=2 + 5.0)
    assert health.held(6.9) and not health.held(7.0)


def test_failures_of_attempts_sent_before_the_hold_do_not_lengthen_it() -> None:
    held = NodeHealth(failures=3, holds=1, held_until=7.0)
    later = held.failed(4.0, POLICY, trial=False)
    assert later == NodeHealth(failures=4, holds=1, held_until=7.0)


def test_after_the_cooldown_the_next_dispatch_is_a_trial_that_holds_for_one_more() -> None:
    held = NodeHealth(failures=3, holds=1, held_until=7.0)
    assert not held.due(6.0, POLICY) and held.due(7.0, POLICY)
    trial = held.trial(7.0, POLICY)
    assert trial.held(8.0) and trial.held_until == 12.0 and not trial.due(8.0, POLICY)


def test_a_failed_trial_doubles_the_cooldown() -> None:
    trial = NodeHealth(failures=3, holds=1, held_until=12.0)
    assert trial.failed(8.0, POLICY, trial=True) == NodeHealth(4, 2, 8.0 + 10.0)


def test_a_failure_after_the_cooldown_holds_again_at_once() -> None:
    """Not held and past the threshold: one more failure is enough, doubled."""
    due = NodeHealth(failures=3, holds=1, held_until=7.0)
    assert due.failed(9.0, POLICY, trial=False) == NodeHealth(4, 2, 19.0)


@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["fail", "trial-fail", "trial", "ok"]), st.floats(0, 50)),
        max_size=40,
    )
)
def test_a_hold_never_reaches_past_the_cap(steps: list[tuple[str, float]]) -> None:
    """Whatever happens, a node is held back at most ``cooldown-max`` from the last event, and
    a success always clears it."""
    health, now = HEALTHY, 0.0
    for step, gap in steps:
        now += gap
        if step == "ok":
            health = HEALTHY
        elif step == "trial":
            if health.due(now, POLICY):
                health = health.trial(now, POLICY)
        else:
            health = health.failed(now, POLICY, trial=step == "trial-fail")
        assert health.held_until is None or health.held_until <= now + POLICY.cooldown_max
        if health.holds:
            assert health.failures >= POLICY.threshold


# -- on a Clock --------------------------------------------------------------------------------


def fail(health: PassiveHealth, node: str = "a", times: int = 1) -> None:
    for _ in range(times):
        health.failed("ollama", node, health.dispatching("ollama", node), "transport")


def test_a_dead_node_costs_one_attempt_per_cooldown() -> None:
    """Held back after three failures; after 5 s one trial; it fails: held 10 s; and so on."""
    clock = Clock()
    health = PassiveHealth(clock, POLICY)
    with capturedLogs() as events:
        fail(health, times=3)
    assert health.held("ollama", "a") and not health.held("ollama", "b")
    assert not health.held("llamacpp", "a")
    assert any(
        e.get("log_format", "").startswith("{node} held back") and e["seconds"] == 5.0
        for e in events
    )
    for cooldown in (5.0, 10.0, 20.0):
        clock.advance(cooldown - 0.5)
        assert health.held("ollama", "a")
        clock.advance(0.5)
        assert not health.held("ollama", "a")
        assert health.dispatching("ollama", "a")  # the trial
        assert health.held("ollama", "a")  # the others keep away while it runs
        assert not health.dispatching("ollama", "a")
        health.failed("ollama", "a", True, "transport")


def test_a_trial_that_takes_longer_than_the_cooldown_lets_a_second_one_through() -> None:
    clock = Clock()
    health = PassiveHealth(clock, POLICY)
    fail(health, times=3)
    clock.advance(5)
    assert health.dispatching("ollama", "a")
    clock.advance(5)
    assert health.dispatching("ollama", "a")


@pytest.mark.parametrize("while_held", [True, False])
def test_a_success_makes_the_node_healthy_again(while_held: bool) -> None:
    clock = Clock()
    health = PassiveHealth(clock, POLICY)
    fail(health, times=3)
    if not while_held:
        clock.advance(5)
        assert health.dispatching("ollama", "a")
    with capturedLogs() as events:
        health.succeeded("ollama", "a")
    assert health.of("ollama", "a") == HEALTHY and not health.held("ollama", "a")
    assert any(e.get("log_format", "").startswith("{node} answers again") for e in events)
    # The count starts over: two failures hold nothing back.
    fail(health, times=2)
    assert not health.held("ollama", "a")


def test_a_success_between_failures_resets_the_count() -> None:
    health = PassiveHealth(Clock(), POLICY)
    fail(health, times=2)
    health.succeeded("ollama", "a")
    fail(health, times=2)
    assert not health.held("ollama", "a")


def test_a_zero_cooldown_never_holds_back() -> None:
    health = PassiveHealth(Clock(), HealthPolicy(1, 0.0, 0.0))
    fail(health, times=5)
    assert not health.held("ollama", "a")
