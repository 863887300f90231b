"""The retry budget as a pure value, property-tested (docs/retry-budget.md)."""

from __future__ import annotations

import inspect
import math
from collections import namedtuple
from collections.abc import Callable
from types import FunctionType
from typing import Any, get_type_hints

from hypothesis import given
from hypothesis import strategies as st

from nvpair.dispatch.budget import BACKOFF_CAP, Bounds, RetryBudget

budgets = st.builds(
    RetryBudget.start,
    created=st.floats(0, 1e6),
    job_deadline=st.floats(0, 3600),
    max_attempts=st.integers(1, 20),
    retry_backoff=st.sampled_from([0.0, 0.05, 0.25, 1.0, 7.5]),
)


@given(
    budgets,
    st.lists(st.sampled_from(["spend", "back off", "wait"]), max_size=60),
    st.floats(0, 1000),
)
def test_the_loop_never_exceeds_either_bound(
    budget: RetryBudget, steps: list[str], step_seconds: float
) -> None:
    """Whatever the loop does, it dispatches only while the budget allows it."""
    now = budget.deadline - 3600  # admission time is at most an hour before the deadline
    for step in steps:
        refusal = budget.refusal(now)
        if step == "spend":
            if refusal is None:
                before = budget.used
                budget = budget.spend()
                assert budget.used == before + 1 <= budget.max_attempts
        elif step == "back off":
            before_backoff = budget.backoff
            budget = budget.backed_off()
            assert budget.backoff == min(before_backoff * 2, budget.first_backoff * BACKOFF_CAP)
        else:
            now += step_seconds
        assert budget.used <= budget.max_attempts
        assert budget.first_backoff <= budget.backoff <= budget.first_backoff * BACKOFF_CAP


@given(budgets, st.floats(-10, 1e6))
def test_refusal_says_which_bound_ended_it(budget: RetryBudget, offset: float) -> None:
    now = budget.deadline + offset - 5e5
    assert budget.refusal(now) == ("deadline" if now >= budget.deadline else None)
    for _ in range(budget.max_attempts):
        budget = budget.spend()
    assert budget.final and budget.refusal(now) == "attempts-exhausted"


@given(budgets, st.floats(-1e4, 1e4), st.integers(0, 6))
def test_a_pause_never_runs_past_the_deadline(
    budget: RetryBudget, offset: float, doublings: int
) -> None:
    for _ in range(doublings):
        budget = budget.backed_off()
    now = budget.deadline - offset
    pause = budget.pause(now)
    if now >= budget.deadline:
        assert pause is None and budget.owner_wait(now) is None
    else:
        assert pause is not None and 0 <= pause <= budget.deadline - now
        assert pause == min(budget.backoff, budget.deadline - now)
        wait = budget.owner_wait(now)
        # A zero backoff waits for the rest of the deadline (woken early by discovery).
        assert wait == (pause or budget.deadline - now) and wait > 0


@given(budgets, st.integers(0, 10))
def test_retry_after_is_whole_seconds_at_least_one(budget: RetryBudget, doublings: int) -> None:
    for _ in range(doublings):
        budget = budget.backed_off()
    retry_after = budget.retry_after()
    assert isinstance(retry_after, int) and retry_after >= max(1, math.ceil(budget.backoff))


@given(st.integers(1, 10), st.floats(0.5, 400), st.floats(1, 900))
def test_fast_slow_and_ownerless_failures_end_as_the_docs_say(
    max_attempts: int, attempt_seconds: float, job_deadline: float
) -> None:
    """Fast failures spend the dispatches; slow ones meet the deadline first
    (docs/retry-budget.md#why-both-bounds-exist)."""
    budget = RetryBudget.start(0.0, job_deadline, max_attempts, 0.0)
    dispatched = 0
    while budget.refusal(dispatched * attempt_seconds) is None:
        budget = budget.spend()
        dispatched += 1
    now = dispatched * attempt_seconds
    started_in_time = sum(1 for k in range(max_attempts) if k * attempt_seconds < job_deadline)
    assert dispatched == started_in_time
    ended_by = budget.refusal(now)
    assert ended_by == ("attempts-exhausted" if dispatched == max_attempts else "deadline")


@given(budgets, st.floats(0, 100), st.floats(0, 200), st.floats(0, 200))
def test_owner_wait_never_runs_past_its_own_bound_or_the_deadline(
    budget: RetryBudget, limit: float, gone_at: float, later: float
) -> None:
    """``--owner-wait`` (fleet mode): counted from when every owner went, within the deadline;
    a wait already running keeps its bound, and an owner back clears it."""
    start = budget.deadline - 3600
    gone = budget.owners_gone(start + gone_at, limit)
    assert gone.owners_gone(start + gone_at + later, limit) == gone
    now = start + gone_at + later
    wait = gone.owner_wait(now)
    plain = budget.owner_wait(now)
    if limit <= 0:
        assert gone == budget and wait == plain
    elif now >= start + gone_at + limit:
        assert wait is None
    else:
        assert plain is not None and wait == min(plain, start + gone_at + limit - now)
    assert gone.owners_back() == budget


@given(budgets, st.floats(0, 7200), st.floats(0, 200), st.floats(0, 7200))
def test_the_wait_that_ran_out_is_the_earlier_bound(
    budget: RetryBudget, limit: float, gone_at: float, later: float
) -> None:
    """When the wait for an owner ends, the answer names what ended it: the owner wait when
    its bound came first, else the deadline (or nothing has run out yet)."""
    start = budget.deadline - 3600
    gone = budget.owners_gone(start + gone_at, limit)
    now = start + gone_at + later
    ran_out = gone.owner_wait_ran_out(now)
    if gone.owner_wait(now) is not None:
        assert not ran_out
    elif limit > 0 and start + gone_at + limit <= budget.deadline:
        assert ran_out
    else:
        assert not ran_out  # the deadline ran out (first)


#: What each method that returns a new budget means to change; every other field it keeps.
CHANGES: dict[str, frozenset[str]] = {
    "spend": frozenset({"used"}),
    "backed_off": frozenset({"backoff"}),
    "owners_gone": frozenset({"owner_deadline"}),
    "owners_back": frozenset({"owner_deadline"}),
}

#: What each such method is given, by its parameter's name.
ARGUMENTS: dict[str, st.SearchStrategy[Any]] = {
    "now": st.floats(0, 1e6),
    "limit": st.floats(0, 3600),
}


def evolving(cls: type[RetryBudget]) -> dict[str, Callable[..., RetryBudget]]:
    """Each method of ``cls`` that returns a new budget from one, by name."""
    return {
        name: value
        for name, value in vars(cls).items()
        if isinstance(value, FunctionType)
        and not name.startswith("_")
        and get_type_hints(value).get("return") is RetryBudget
    }


def with_a_field_added() -> type[Any]:
    """:class:`RetryBudget` as it would be with one more field (``added``, last, defaulting to
    None), every method of its own carried over unchanged."""
    plain = set(vars(namedtuple("Plain", "x")))
    fields = [*RetryBudget._fields, "added"]
    base = namedtuple("Extended", fields, defaults=(*RetryBudget._field_defaults.values(), None))  # type: ignore[misc]
    own = {
        name: value
        for name, value in vars(RetryBudget).items()
        if name not in plain and name not in RetryBudget._fields and not name.startswith("__")
    }
    return type("Extended", (base,), {**own, "__slots__": ()})


#: Made once. Made per example, the class's own ``_replace`` now and then refused ``added`` on
#: hypothesis's first call and not on its replay (seen about once in fifteen runs; the cause
#: was not found); made once, thirty runs in a row passed.
EXTENDED = with_a_field_added()


#: A budget as any point of a request's life may hold it, every field set.
any_budget = st.builds(
    RetryBudget,
    max_attempts=st.integers(1, 20),
    deadline=st.floats(0, 1e6),
    first_backoff=st.sampled_from([0.0, 0.05, 1.0]),
    used=st.integers(0, 20),
    backoff=st.sampled_from([0.0, 0.05, 0.4, 8.0]),
    owner_deadline=st.none() | st.floats(0, 1e6),
)


def test_every_method_that_returns_a_budget_says_what_it_changes() -> None:
    assert set(evolving(RetryBudget)) == set(CHANGES)


@given(any_budget, st.sampled_from(sorted(CHANGES)), st.data())
def test_a_new_budget_keeps_every_field_it_does_not_mean_to_change(
    budget: RetryBudget, name: str, data: st.DataObject
) -> None:
    """``spend`` once dropped ``owner_deadline`` (issue 34): no method loses a field."""
    method = evolving(RetryBudget)[name]
    parameters = list(inspect.signature(method).parameters)[1:]
    after = method(budget, *(data.draw(ARGUMENTS[p], label=p) for p in parameters))
    kept = set(RetryBudget._fields) - CHANGES[name]
    assert {f: getattr(after, f) for f in kept} == {f: getattr(budget, f) for f in kept}


@given(
    budgets,
    st.lists(st.sampled_from(sorted(CHANGES)), max_size=12),
    st.data(),
)
def test_a_field_added_to_the_budget_survives_every_path(
    budget: RetryBudget, steps: list[str], data: st.DataObject
) -> None:
    """Were a field added, every way to make or change a budget would carry it."""
    extended = EXTENDED
    marker = object()
    made = extended.start(0.0, budget.deadline, budget.max_attempts, budget.first_backoff)
    assert type(made) is extended and made.added is None
    current = made._replace(added=marker)
    for name in steps:
        method = getattr(current, name)
        parameters = list(inspect.signature(method).parameters)
        current = method(*(data.draw(ARGUMENTS[p], label=p) for p in parameters))
        assert type(current) is extended and current.added is marker, name


@given(st.floats(0, 1e6), st.floats(0, 3600), st.integers(1, 20), st.floats(0, 8))
def test_the_bounds_make_a_budget_as_start_does(
    created: float, job_deadline: float, max_attempts: int, retry_backoff: float
) -> None:
    bounds = Bounds(1.0, 1.0, job_deadline, max_attempts, retry_backoff, 0.0)
    assert bounds.budget(created) == RetryBudget.start(
        created, job_deadline, max_attempts, retry_backoff
    )
