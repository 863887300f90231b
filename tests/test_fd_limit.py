"""The process raises its soft open-files limit to the hard one at start."""

from __future__ import annotations

import resource

from nvpair.service import raise_fd_limit


def test_soft_limit_is_raised_to_the_hard_limit() -> None:
    applied: list[tuple[int, tuple[int, int]]] = []
    limit = raise_fd_limit(
        lambda which: (1024, 524288), lambda which, v: applied.append((which, v))
    )
    assert limit == 524288 and applied == [(resource.RLIMIT_NOFILE, (524288, 524288))]


def test_a_refused_raise_keeps_the_soft_limit() -> None:
    def refuse(which: int, value: tuple[int, int]) -> None:
        raise ValueError("not permitted")

    assert raise_fd_limit(lambda which: (1024, 4096), refuse) == 1024


def test_already_at_the_hard_limit_changes_nothing() -> None:
    applied: list[object] = []
    assert raise_fd_limit(lambda which: (4096, 4096), lambda w, v: applied.append(v)) == 4096
    assert applied == []


def test_the_real_limit_of_this_process_can_be_raised() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        assert raise_fd_limit() == (hard if hard != resource.RLIM_INFINITY else soft)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
