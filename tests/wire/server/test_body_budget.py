"""The request bodies held at once, against ``--max-body-memory``
(nvpair/wire/server/body_budget.py; docs/robustness.md#what-a-request-body-costs): values in,
values out, no reactor."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvpair.wire.server.body_budget import DEFAULT_MAX_BODY_MEMORY, BodyBudget


def test_a_reservation_that_fits_is_held_and_one_that_does_not_is_refused_whole() -> None:
    budget = BodyBudget(100)
    assert budget.reserve(60) and budget.held == 60
    assert not budget.reserve(41) and budget.held == 60
    assert budget.reserve(40) and budget.held == 100
    budget.release(60)
    assert budget.held == 40


def test_the_default_is_four_bodies_at_the_default_cap() -> None:
    assert BodyBudget().limit == DEFAULT_MAX_BODY_MEMORY == 4 * 67108864


def test_giving_back_more_than_is_held_is_a_bug_not_a_negative_count() -> None:
    budget = BodyBudget(10)
    budget.reserve(3)
    with pytest.raises(ValueError, match="released 4 bytes of 3"):
        budget.release(4)
    assert budget.held == 3


def test_a_budget_is_positive() -> None:
    with pytest.raises(ValueError):
        BodyBudget(0)


@given(st.integers(1, 1000), st.lists(st.tuples(st.booleans(), st.integers(0, 400))))
def test_what_is_held_is_what_was_reserved_and_not_yet_released_never_past_the_bound(
    limit: int, steps: list[tuple[bool, int]]
) -> None:
    budget = BodyBudget(limit)
    reservations: list[int] = []
    for reserving, size in steps:
        if reserving:
            fits = sum(reservations) + size <= limit
            assert budget.reserve(size) == fits
            if fits:
                reservations.append(size)
        elif reservations:
            budget.release(reservations.pop(size % len(reservations)))
        assert budget.held == sum(reservations) <= limit
    for size in reservations:
        budget.release(size)
    assert budget.held == 0
