"""Failed keys per address, in a sliding window on a Clock (docs/lan.md#failed-keys)."""

from __future__ import annotations

from twisted.internet.task import Clock

from nvpair.fleet.throttle import FAILURES, WINDOW, FailedKeys


def test_ten_failures_within_the_window_close_the_address_until_the_oldest_is_out() -> None:
    clock = Clock()
    failed: FailedKeys[str] = FailedKeys(clock)
    for _ in range(FAILURES - 1):
        failed.failed("a")
        clock.advance(1)
    assert failed.retry_after("a") is None  # nine: still open
    failed.failed("a")  # the tenth, 9 s after the first
    assert failed.retry_after("a") == WINDOW - 9
    assert failed.retry_after("b") is None  # per address
    clock.advance(WINDOW - 9 - 0.5)
    assert failed.retry_after("a") == 1  # rounded up, at least 1
    clock.advance(0.5)
    assert failed.retry_after("a") is None  # the first is out of the window
    failed.failed("a")  # nine in the window again, then a tenth: closed again
    assert failed.retry_after("a") == 1


def test_failures_spread_wider_than_the_window_never_close() -> None:
    clock = Clock()
    failed: FailedKeys[str] = FailedKeys(clock)
    for _ in range(100):
        failed.failed("a")
        clock.advance(WINDOW / (FAILURES - 1) + 0.01)
        assert failed.retry_after("a") is None


def test_an_address_whose_failures_are_all_old_is_forgotten() -> None:
    clock = Clock()
    failed: FailedKeys[str] = FailedKeys(clock)
    failed.failed("a")
    clock.advance(WINDOW)
    assert failed.retry_after("a") is None and len(failed) == 0


def test_memory_is_bounded_the_stalest_address_forgotten_first() -> None:
    clock = Clock()
    failed: FailedKeys[str] = FailedKeys(clock, failures=2, addresses=3)
    for address in "abc":
        failed.failed(address)
        clock.advance(1)
    failed.failed("a")  # a is now the freshest, and closed
    failed.failed("d")  # b, the stalest, goes
    assert len(failed) == 3
    assert failed.retry_after("a") is not None
    failed.failed("b")  # b starts again from one
    assert failed.retry_after("b") is None


def test_a_closed_address_stays_closed_whatever_fails_elsewhere() -> None:
    """Issue 29 item 6: 4,096 failures from other addresses once evicted a closed one."""
    clock = Clock()
    failed: FailedKeys[str] = FailedKeys(clock, addresses=8)
    for _ in range(FAILURES):
        failed.failed("guesser")
    for index in range(4096):
        failed.failed(f"other-{index}")
    assert len(failed) <= 8
    assert failed.retry_after("guesser") == WINDOW
    clock.advance(WINDOW)
    assert failed.retry_after("guesser") is None


def test_with_every_remembered_address_closed_the_rest_count_together() -> None:
    """No room for another address: their failures share one count, and ten of them close
    every address not remembered until their window ends — never more guesses than that."""
    clock = Clock()
    failed: FailedKeys[str] = FailedKeys(clock, addresses=2)
    for address in ("a", "b"):
        for _ in range(FAILURES):
            failed.failed(address)
    for index in range(FAILURES - 1):
        failed.failed(f"new-{index}")
        assert failed.retry_after(f"new-{index + 1}") is None
    failed.failed("new-last")
    assert failed.retry_after("anyone") == WINDOW
    assert failed.retry_after("a") == WINDOW
    clock.advance(WINDOW)
    assert failed.retry_after("anyone") is None and failed.retry_after("a") is None
    failed.failed("c")  # the closed ones' windows ended: room again
    assert len(failed) <= 2
