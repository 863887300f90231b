"""Where a conversation's cache is, and whether a node's cache keeps what it is sent
(docs/fleet-scheduling.md#conversations-go-where-their-cache-is).

Two pure records that standalone fleet mode's scheduler keeps (:mod:`nvpair.fleet.scheduling`):

- :class:`PrefixTable`: each prefix key (:mod:`nvpair.engines.conversation`) of a served
  request, under the node that served it, so that the next turn finds that node. Bounded, least
  recently used out.
- :class:`CacheLedger`: what each node's answers said they found in cache. A node whose last
  affinity-routed answers found, together, under a quarter of their prompts there has a cache
  too small for what it is sent: affinity stops preferring it for a while.

Values in, values out: the clock is an argument. No reactor, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence

from attrs import define, field, frozen

#: Most entries the table holds, over every (engine, model) together.
TABLE_BOUND = 100_000
#: Answers the cache share of ``/status`` is taken over.
SHARE_WINDOW = 200
#: Affinity-routed answers judged together for a suspension.
ROUTED_WINDOW = 20
#: Below this share of prompt tokens from cache, over :data:`ROUTED_WINDOW` answers, a node's
#: affinity is suspended.
MIN_ROUTED_SHARE = 0.25
#: How long a suspension lasts (seconds).
SUSPENSION = 600.0


@frozen
class AffinityOptions:
    """``[scheduling]`` in the fleet file.

    :ivar enabled: ``affinity``: order warm owners by where the conversation was served.
    :ivar slack: ``affinity-slack``: how much busier (in flight plus busy slots) the
        conversation's node may be than the least-loaded warm owner and still go first.
    """

    enabled: bool = True
    slack: int = 2


#: Affinity on, slack 2: what a fleet file without ``[scheduling]`` gets.
DEFAULT_AFFINITY = AffinityOptions()


def scope(engine: str, model_key: str | None) -> int:
    """The (engine, model) a key is kept under, as a number its keys are combined with: one
    table serves every pair, and a key recorded for one pair is never found for another."""
    return hash((engine, model_key))


class PrefixTable:
    """Prefix keys of served requests → the node that served them, least recently used out.

    :param bound: most entries kept (:data:`TABLE_BOUND`).
    """

    def __init__(self, bound: int = TABLE_BOUND) -> None:
        if bound < 1:
            raise ValueError("a prefix table holds at least one entry")
        self.bound = bound
        self._owners: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owners)

    def owner(
        self, within: int, keys: Sequence[int], usable: Callable[[str], bool]
    ) -> tuple[str, int] | None:
        """The node recorded for the longest of ``keys`` (shortest first) whose node is
        ``usable``, with how many leading pieces that key covers; None when none is."""
        owners = self._owners
        for index in range(len(keys) - 1, -1, -1):
            key = keys[index] ^ within
            node = owners.get(key)
            if node is not None and usable(node):
                owners.move_to_end(key)
                return node, index + 1
        return None

    def record(self, within: int, keys: Sequence[int], node: str) -> None:
        """``node`` served a request with ``keys``: each now names it, the oldest entries
        going when the table is full."""
        owners = self._owners
        for piece in keys:
            key = piece ^ within
            owners[key] = node
            owners.move_to_end(key)
        while len(owners) > self.bound:
            owners.popitem(last=False)


@define
class _NodeCache:
    #: (prompt tokens, of which from cache) of the last answers that said.
    reports: deque[tuple[int, int]] = field(factory=lambda: deque(maxlen=SHARE_WINDOW))
    #: The same, of the answers affinity sent there, since the last suspension.
    routed: deque[tuple[int, int]] = field(factory=lambda: deque(maxlen=ROUTED_WINDOW))
    #: ``routed``'s sums, kept as it moves (summed anew, the window cost every answer twenty
    #: steps twice; docs/performance.md#per-dispatch-overheads).
    routed_tokens: int = 0
    routed_found: int = 0
    suspended_until: float | None = None


@frozen
class CacheShare:
    """What a node's answers said of its cache, as ``/status`` shows it.

    :ivar answers: answers that reported it (of the last :data:`SHARE_WINDOW`).
    :ivar prompt_tokens: their prompt tokens.
    :ivar cached_tokens: of those, the ones read from cache.
    :ivar suspended_until: when affinity prefers the node again (clock time), or None.
    """

    answers: int
    prompt_tokens: int
    cached_tokens: int
    suspended_until: float | None

    @property
    def share(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


class CacheLedger:
    """Each (engine, node)'s answers' cache reports."""

    def __init__(self) -> None:
        self._nodes: dict[tuple[str, str], _NodeCache] = {}

    def reported(
        self, engine: str, node: str, prompt: int, cached: int, routed: bool, now: float
    ) -> None:
        """An answer from ``node`` read ``prompt`` tokens, ``cached`` of them from cache;
        ``routed``: affinity sent it there.

        One miss says nothing (the node has just read the whole prompt, so it holds it now);
        :data:`ROUTED_WINDOW` routed answers that together found under
        :data:`MIN_ROUTED_SHARE` of their prompts in cache suspend the node's affinity for
        :data:`SUSPENSION` seconds, after which it is tried again from an empty window.
        """
        if prompt <= 0:
            return
        cached = max(0, min(cached, prompt))
        entry = self._nodes.get((engine, node))
        if entry is None:
            entry = self._nodes[(engine, node)] = _NodeCache()
        entry.reports.append((prompt, cached))
        if not routed:
            return
        until = entry.suspended_until
        if until is not None:
            if now < until:
                return
            entry.suspended_until = None
        window = entry.routed
        if len(window) == ROUTED_WINDOW:
            gone_tokens, gone_found = window[0]  # appending drops it
            entry.routed_tokens -= gone_tokens
            entry.routed_found -= gone_found
        window.append((prompt, cached))
        entry.routed_tokens += prompt
        entry.routed_found += cached
        full = len(window) == ROUTED_WINDOW
        if full and entry.routed_found < MIN_ROUTED_SHARE * entry.routed_tokens:
            entry.suspended_until = now + SUSPENSION
            window.clear()
            entry.routed_tokens = entry.routed_found = 0

    def suspended(self, engine: str, node: str, now: float) -> bool:
        """Whether affinity skips ``node`` now."""
        entry = self._nodes.get((engine, node))
        if entry is None or entry.suspended_until is None:
            return False
        if now < entry.suspended_until:
            return True
        entry.suspended_until = None
        return False

    def share(self, engine: str, node: str, now: float) -> CacheShare | None:
        """What ``node``'s answers said of its cache; None when none said."""
        entry = self._nodes.get((engine, node))
        if entry is None:
            return None
        until = entry.suspended_until if self.suspended(engine, node, now) else None
        return CacheShare(
            answers=len(entry.reports),
            prompt_tokens=sum(tokens for tokens, _ in entry.reports),
            cached_tokens=sum(hits for _, hits in entry.reports),
            suspended_until=until,
        )

    def forget(self, engine: str, node: str) -> None:
        """A reload removed or moved the node."""
        self._nodes.pop((engine, node), None)
