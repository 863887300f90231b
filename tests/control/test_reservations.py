"""The reservation map (docs/candidate-order.md#reservations), including property tests over
random interleavings."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nvpair.control.reservations import Reservation, Reservations


def test_take_and_release() -> None:
    r = Reservations()
    a1, a2 = r.take("a"), r.take("a")
    assert r.counts == {"a": 2}
    r.release(a1)
    r.release(a1)  # once only
    assert r.counts == {"a": 1}
    r.release(a2)
    assert r.counts == {}


def test_move_follows_the_dispatch() -> None:
    r = Reservations()
    claim = r.move(r.take("a"), "b")
    assert r.counts == {"b": 1} and claim.node == "b"
    assert r.move(claim, "b") is claim and r.counts == {"b": 1}


def test_newer_snapshot_supersedes_and_old_release_is_dropped() -> None:
    """A release naming an older generation must not drive the count below the truth."""
    r = Reservations()
    old = r.take("a")
    r.new_snapshot(1)
    assert r.counts == {}
    fresh = r.take("a")
    r.release(old)
    assert r.counts == {"a": 1}
    r.release(fresh)
    assert r.counts == {}


def test_moving_a_superseded_claim_takes_a_fresh_one() -> None:
    r = Reservations()
    old = r.take("a")
    r.new_snapshot(5)
    claim = r.move(old, "a")
    assert claim is not old and claim.generation == 5 and r.counts == {"a": 1}


def test_redelivered_generation_is_a_caller_bug() -> None:
    r = Reservations()
    r.new_snapshot(3)
    with pytest.raises(ValueError):
        r.new_snapshot(3)


NODES = st.sampled_from(["a", "b", "c"])


class ReservationMachine(RuleBasedStateMachine):
    """Random take / move / release / snapshot interleavings against a simple model.

    The model: each live (unreleased, current-generation) claim counts once on its node.
    """

    def __init__(self) -> None:
        super().__init__()
        self.map = Reservations()
        self.claims: list[Reservation] = []
        self.generation = self.map.generation  # before any snapshot

    @rule(node=NODES)
    def take(self, node: str) -> None:
        self.claims.append(self.map.take(node))

    @precondition(lambda self: self.claims)
    @rule(index=st.integers(min_value=0), node=NODES)
    def move(self, index: int, node: str) -> None:
        i = index % len(self.claims)
        self.claims[i] = self.map.move(self.claims[i], node)

    @precondition(lambda self: self.claims)
    @rule(index=st.integers(min_value=0))
    def release(self, index: int) -> None:
        self.map.release(self.claims[index % len(self.claims)])

    @rule(step=st.integers(min_value=1, max_value=3))
    def snapshot(self, step: int) -> None:
        self.generation += step
        self.map.new_snapshot(self.generation)

    @rule(back=st.integers(min_value=0, max_value=2))
    def redelivered_snapshot(self, back: int) -> None:
        """The control layer drops a generation <= the last; the live map is untouched."""
        before = dict(self.map.counts)
        with pytest.raises(ValueError):
            self.map.new_snapshot(self.generation - back)
        assert dict(self.map.counts) == before

    @invariant()
    def never_negative(self) -> None:
        assert all(count > 0 for count in self.map.counts.values())

    @invariant()
    def counts_match_live_claims(self) -> None:
        expected: dict[str, int] = {}
        for claim in self.claims:
            if not claim.released and claim.generation == self.generation:
                expected[claim.node] = expected.get(claim.node, 0) + 1
        assert dict(self.map.counts) == expected


TestReservationMachine = ReservationMachine.TestCase
