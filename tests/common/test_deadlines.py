# -*- test-case-name: tests.common.test_deadlines -*-
"""Deadlines of one duration on one reactor timer (:mod:`nvpair.common.deadlines`) fire when a
timer of their own would have, and only then: driven side by side with one ``callLater`` per
deadline on a ``Clock``, through generated adds, cancels and waits."""

from __future__ import annotations

from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, LogEvent, globalLogPublisher
from zope.interface import provider

from nvpair.common.deadlines import Deadline, Deadlines

SECONDS = 10.0


def _note(into: list[tuple[int, float]], number: int, clock: Clock) -> None:
    into.append((number, clock.seconds()))


_STEP = st.one_of(
    st.tuples(st.just("add"), st.just(0)),
    st.tuples(st.just("cancel"), st.integers(min_value=0, max_value=40)),
    st.tuples(st.just("wait"), st.sampled_from([0.0, 0.5, 1.0, 3.0, 9.999, 10.0, 25.0])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_STEP, max_size=40))
def test_each_deadline_fires_when_a_timer_of_its_own_would(
    steps: list[tuple[str, float]],
) -> None:
    clock, own_clock = Clock(), Clock()
    deadlines = Deadlines(clock, SECONDS)
    fired: list[tuple[int, float]] = []
    expected: list[tuple[int, float]] = []
    handles: list[Deadline] = []
    timers = []
    for kind, value in steps:
        if kind == "add":
            number = len(handles)
            handles.append(deadlines.add(partial(_note, fired, number, clock)))
            timers.append(own_clock.callLater(SECONDS, _note, expected, number, own_clock))
        elif kind == "cancel" and handles:
            index = int(value) % len(handles)
            handles[index].cancel()
            if timers[index].active():
                timers[index].cancel()
        elif kind == "wait":
            clock.advance(value)
            own_clock.advance(value)
        assert fired == expected
        assert [h.active() for h in handles] == [t.active() for t in timers]
        assert len(deadlines) == sum(t.active() for t in timers)
        # One reactor timer at most, whatever is pending.
        assert len(clock.getDelayedCalls()) <= 1
    clock.advance(SECONDS)
    own_clock.advance(SECONDS)
    assert fired == expected


def test_a_deadline_added_earlier_than_the_timer_moves_it() -> None:
    """The reactor timer is never later than the earliest deadline pending: a clock set back
    (wall time) gives a new deadline an earlier time than the one the timer waits for."""

    class BackClock(Clock):
        pass

    clock = BackClock()
    clock.advance(100.0)
    deadlines = Deadlines(clock, SECONDS)
    fired: list[str] = []
    deadlines.add(lambda: fired.append("late"))
    clock.rightNow = 50.0  # set back
    deadlines.add(lambda: fired.append("early"))
    (timer,) = clock.getDelayedCalls()
    assert timer.getTime() == 60.0
    clock.advance(10.0)
    assert fired == ["early"]
    clock.advance(50.0)
    assert fired == ["early", "late"]


def test_a_callback_that_fails_is_logged_and_the_others_still_fire() -> None:
    clock = Clock()
    deadlines = Deadlines(clock, SECONDS)
    fired: list[str] = []

    def broken() -> None:
        raise RuntimeError("boom")

    deadlines.add(broken)
    deadlines.add(lambda: fired.append("after"))
    events: list[LogEvent] = []

    @provider(ILogObserver)
    def observe(event: LogEvent) -> None:
        events.append(event)

    globalLogPublisher.addObserver(observe)
    try:
        clock.advance(SECONDS)
    finally:
        globalLogPublisher.removeObserver(observe)
    assert fired == ["after"]
    assert any(e.get("log_failure") is not None for e in events)


def test_a_callback_may_add_and_cancel_deadlines() -> None:
    """As with timers of their own: one due at the same time but cancelled by a callback before
    it does not fire, and one added by a callback fires a duration later."""
    clock = Clock()
    deadlines = Deadlines(clock, SECONDS)
    fired: list[float] = []
    later: list[Deadline] = []

    def first() -> None:
        fired.append(clock.seconds())
        other.cancel()
        later.append(deadlines.add(lambda: fired.append(clock.seconds())))

    deadlines.add(first)
    other = deadlines.add(lambda: fired.append(-1.0))
    clock.advance(SECONDS)
    assert fired == [SECONDS]
    clock.advance(SECONDS)
    assert fired == [SECONDS, 2 * SECONDS]
    assert not later[0].active() and len(deadlines) == 0


@pytest.mark.parametrize("seconds", [0.001, 300.0])
def test_a_cancelled_deadline_never_fires(seconds: float) -> None:
    clock = Clock()
    deadlines = Deadlines(clock, seconds)
    fired: list[bool] = []
    deadline = deadlines.add(lambda: fired.append(True))
    deadline.cancel()
    deadline.cancel()  # twice is nothing
    clock.advance(2 * seconds)
    assert fired == [] and not deadline.active()
