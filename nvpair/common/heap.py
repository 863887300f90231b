"""The cyclic garbage collector, set for a long-running server
(docs/performance.md#the-garbage-collector).

CPython's defaults suit a short script. In this process, at startup, some 58,000 objects are
created that live as long as it does (Twisted, the engines' tables, klein and prometheus-client
with an admin listener), and a request allocates and frees a few hundred containers, nearly all
freed by reference counting. With the defaults the collector still spent about 4 % of the CPU of a
request at c=32: a full collection traversed every object of the startup every few thousand
requests, and the youngest generation was collected every few dozen requests. So, once the
process is up:

- what exists then is collected once and frozen (moved to the permanent generation: no later
  collection traverses it again);
- the youngest generation is collected after :data:`YOUNG` net allocations instead of 700.

Cycles made later are still collected, only later: a request makes well under one on average.
"""

from __future__ import annotations

import gc

#: Net allocations of containers between two collections of the youngest generation (700 by
#: default; the older generations keep their defaults, counted in these collections).
YOUNG = 7000


def settle() -> None:
    """Once the process is up: collect, freeze what survived, collect the young less often."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)


__all__ = ["YOUNG", "settle"]
