"""What a flood held is given back once it is over (docs/robustness.md#connection-bounds)."""

from __future__ import annotations

import gc
import sys
import weakref

import pytest

from nvpair.common import trim


class _Cycle:
    """As a TLS connection and its OpenSSL state: each refers to the other."""

    def __init__(self) -> None:
        self.other = self


def test_cycles_are_collected_though_the_collector_would_wait() -> None:
    enabled = gc.isenabled()
    gc.disable()
    try:
        cycle = _Cycle()
        gone = weakref.ref(cycle)
        del cycle
        assert gone() is not None
        trim.give_back()
        assert gone() is None
    finally:
        if enabled:
            gc.enable()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_glibcs_heap_is_trimmed() -> None:
    assert trim._malloc_trim() is not None
