"""Memory a flood of connections held, given back to the system once it is over
(docs/robustness.md#connection-bounds).

Two things keep it after the connections are gone. A TLS connection and its OpenSSL state refer
to each other, so only the cyclic collector frees them, and in this process it runs after
thousands of allocations (:mod:`nvpair.common.heap`), which a quiet process may not make for a
long time. And glibc keeps what ``free`` returns in its heap, for reuse: ``malloc_trim`` returns
the heap's free pages. Where there is no ``malloc_trim`` (musl, macOS) the collection is all.
"""

from __future__ import annotations

import ctypes
import functools
import gc
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def give_back() -> None:
    """Collect the cycles left, then return the C heap's free pages to the system."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
