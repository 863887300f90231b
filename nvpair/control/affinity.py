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
from typing import NamedTuple

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


#: What the order did with a request's conversation (docs/fleet-scheduling.md
#: #what-the-operator-sees-of-affinity), as ``/status``, ``/metrics`` and the access log say it:
#: sent to its conversation's node; its node was known and the order chose another; no key of
#: the request was known.
FOLLOWED, MOVED, NEW = "followed", "moved", "new"

#: Why a known conversation's node did not go first (``moved``): more than ``affinity-slack``
#: busier than the least-loaded warm owner; not in the round's best tier (the model not in
#: memory there, or loading, or every slot busy while another owner has one free); its affinity
#: suspended (its cache keeps too little); held back (passive health, or an unanswered liveness
#: probe); it left between the plan and the dispatch; the queue gave another owner's place first.
BUSIER, TIER, SUSPENDED, HELD_BACK, LEFT, QUEUE = (
    "busier",
    "tier",
    "suspended",
    "held-back",
    "left",
    "queue",
)


class Conversation(NamedTuple):
    """What a round's order knew of a request's conversation (one per keyed round: a
    NamedTuple).

    :ivar node: (engine, node id) of its conversation's node, the owner recorded for the
        longest of its keys among the round's owners; None: no key was known (``new``).
    :ivar passed_over: why that node does not go first (:data:`BUSIER`, ...), or None when
        affinity put it first.
    """

    node: tuple[str, str] | None
    passed_over: str | None = None


class Verdict(NamedTuple):
    """What the order did with a request, judged at its first dispatch.

    :ivar result: :data:`FOLLOWED`, :data:`MOVED` or :data:`NEW`.
    :ivar why: for ``moved``, why (:data:`BUSIER`, ...); else None.
    :ivar node: the conversation's node id, when one was known.
    """

    result: str
    why: str | None = None
    node: str | None = None


def verdict(known: Conversation, engine: str, node: str, elsewhere: str) -> Verdict:
    """``known``'s request is dispatched first to ``engine``'s ``node``; ``elsewhere``: why,
    if affinity put its node first, the dispatch went to another (:data:`LEFT`,
    :data:`QUEUE`)."""
    if known.node is None:
        return Verdict(NEW)
    known_engine, known_node = known.node
    if known_engine == engine and known_node == node:
        return Verdict(FOLLOWED, None, node)
    return Verdict(MOVED, known.passed_over or elsewhere, known_node)


class Owner(NamedTuple):
    """A node as the table names it. One per node, shared by all its entries, so that an
    entry costs what a node id alone would (a NamedTuple: no larger than a plain pair).

    :ivar engine: the engine it runs.
    :ivar node: its node id.
    """

    engine: str
    node: str


class Found(NamedTuple):
    """What :meth:`PrefixTable.owner` found for a request's keys.

    :ivar node: the node id recorded for the longest usable key.
    :ivar covered: how many leading pieces of the request that key covers.
    """

    node: str
    covered: int


class PrefixTable:
    """Prefix keys of served requests → the node that served them, least recently used out.

    :param bound: most entries kept (:data:`TABLE_BOUND`).
    """

    def __init__(self, bound: int = TABLE_BOUND) -> None:
        if bound < 1:
            raise ValueError("a prefix table holds at least one entry")
        self.bound = bound
        self._owners: OrderedDict[int, Owner] = OrderedDict()
        self._shared: dict[Owner, Owner] = {}

    def __len__(self) -> int:
        return len(self._owners)

    def owner(
        self, within: int, keys: Sequence[int], usable: Callable[[str], bool]
    ) -> Found | None:
        """The node recorded for the longest of ``keys`` (shortest first) whose node is
        ``usable``, with how many leading pieces that key covers; None when none is."""
        owners = self._owners
        for index in range(len(keys) - 1, -1, -1):
            key = keys[index] ^ within
            owner = owners.get(key)
            if owner is not None and usable(owner.node):
                owners.move_to_end(key)
                return Found(owner.node, index + 1)
        return None

    def record(self, within: int, keys: Sequence[int], engine: str, node: str) -> None:
        """``engine``'s ``node`` served a request with ``keys``: each now names it, the oldest
        entries going when the table is full."""
        owners = self._owners
        named = Owner(engine, node)
        owner = self._shared.setdefault(named, named)
        for piece in keys:
            key = piece ^ within
            owners[key] = owner
            owners.move_to_end(key)
        while len(owners) > self.bound:
            owners.popitem(last=False)

    def forget(self, engine: str, node: str) -> int:
        """``engine`` on ``node`` no longer holds what it was sent (it left discovery, or
        restarted): every entry naming it goes, so that no turn is sent to a cache that is
        gone (docs/fleet-scheduling.md#a-node-that-restarted-forgets). How many went.

        One pass over the table (a few milliseconds when full): a node leaves far more rarely
        than requests look up, and an index per node would cost memory on every entry."""
        owner = self._shared.pop(Owner(engine, node), None)
        if owner is None:
            return 0
        owners = self._owners
        gone = [key for key, named in owners.items() if named is owner]
        for key in gone:
            del owners[key]
        return len(gone)


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
