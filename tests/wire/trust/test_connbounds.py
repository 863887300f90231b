"""Connections from every address but loopback, counted per source before anything else is known
of the caller (docs/robustness.md#connection-bounds): values in, values out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvpair.wire.trust.connbounds import (
    BURST,
    HANDSHAKES,
    PER_SOURCE,
    ConnectionCounts,
    Refused,
    lan_capacity,
    source_of,
)


@pytest.mark.parametrize(
    ("host", "source"),
    [
        ("192.168.1.7", "192.168.1.7"),
        ("::ffff:192.168.1.7", "192.168.1.7"),
        ("2001:db8:1:2:a:b:c:d", "2001:db8:1:2::/64"),
        ("2001:db8:1:2::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("127.0.0.1", None),
        ("127.9.9.9", None),
        ("::1", None),
        ("::ffff:127.0.0.1", None),
    ],
)
def test_a_source_is_an_ipv4_address_or_an_ipv6_slash_64_and_loopback_is_none(
    host: str, source: str | None
) -> None:
    """IPv4-mapped IPv6 is its IPv4 address; every address of one /64 is one source."""
    assert source_of(host) == source


def test_a_source_holds_at_most_its_bound_and_a_refusal_counts_nothing() -> None:
    counts = ConnectionCounts()
    for _ in range(PER_SOURCE):
        assert counts.open("10.0.0.1") is None
    assert counts.open("10.0.0.1") is Refused.SOURCE
    assert counts.held_by("10.0.0.1") == PER_SOURCE and counts.connections == PER_SOURCE
    # Another source is not touched by the first one's bound.
    assert counts.open("10.0.0.2") is None
    counts.close("10.0.0.1")
    assert counts.open("10.0.0.1") is None


def test_every_source_together_stays_within_the_capacity() -> None:
    """The reserve: past ``capacity`` every source is refused, however little it holds."""
    counts = ConnectionCounts(capacity=3)
    for host in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        assert counts.open(host) is None
    assert counts.open("10.0.0.4") is Refused.RESERVE
    counts.close("10.0.0.2")
    assert counts.open("10.0.0.4") is None
    # A capacity set later (once the open-files limit is raised) applies from then on.
    counts.capacity = 10
    assert counts.open("10.0.0.5") is None


def test_handshakes_in_progress_are_bounded() -> None:
    counts = ConnectionCounts()
    assert all(counts.begin_handshake() for _ in range(HANDSHAKES))
    assert not counts.begin_handshake() and counts.handshakes == HANDSHAKES
    counts.end_handshake()
    assert counts.begin_handshake()


def test_the_last_handshake_of_a_burst_says_so_once() -> None:
    """The moment to give back what a flood of handshakes held: none left in progress, after
    BURST or more at once; a few at a time never say it."""
    counts = ConnectionCounts()
    for _ in range(3):
        assert counts.begin_handshake()
        assert counts.end_handshake() is False
    for _ in range(BURST):
        assert counts.begin_handshake()
    assert [counts.end_handshake() for _ in range(BURST)] == [False] * (BURST - 1) + [True]
    assert counts.begin_handshake() and counts.end_handshake() is False


def test_the_reserve_is_a_quarter_of_the_open_files_limit() -> None:
    assert lan_capacity(1024) == 768
    assert lan_capacity(524288) == 393216
    assert lan_capacity(-1) is None  # RLIM_INFINITY


_SOURCES = st.sampled_from(["10.0.0.1", "10.0.0.2", "2001:db8::/64"])


@given(st.lists(st.tuples(st.booleans(), _SOURCES), max_size=400))
def test_counts_never_exceed_a_bound_nor_go_negative(steps: list[tuple[bool, str]]) -> None:
    """Whatever the order of accepts and closes (a close only for what was counted), each
    source holds at most its bound, all of them at most the capacity, and the total is the
    sum of the sources'."""
    counts = ConnectionCounts(capacity=100, per_source=40)
    held: dict[str, int] = {}
    for opening, source in steps:
        if opening:
            if counts.open(source) is None:
                held[source] = held.get(source, 0) + 1
        elif held.get(source):
            counts.close(source)
            held[source] -= 1
        assert all(counts.held_by(s) == n for s, n in held.items())
        assert max(held.values(), default=0) <= 40
        assert counts.connections == sum(held.values()) <= 100
