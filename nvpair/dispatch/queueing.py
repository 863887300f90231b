"""The fleet's queue, live: requests that cannot start wait here, and each takes the first place
that frees on any of its owners (docs/fleet-scheduling.md#the-queue).

The decisions are :mod:`nvpair.control.fairqueue`'s; this module holds the waiting requests'
Deferreds and timers and runs a pump whenever capacity may have freed: an attempt ended
(:meth:`FleetQueue.release`), a poll read a node or discovery changed (:meth:`FleetQueue.pump`,
called by the fleet's polls), and once a second while anything waits, so that a reading no
event announces (another client's request ending on a node) is acted on too.

Broker mode has none (:data:`NO_QUEUE`): its scheduler decides and the engines queue.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Mapping, Sequence

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from nvpair.control.fairqueue import (
    DEFAULT_QUEUE,
    Ledger,
    NodeId,
    Option,
    QueueOptions,
    Turns,
    Waiter,
    pump,
)
from nvpair.engines.caller import Priority
from nvpair.engines.loadstate import LoadState

#: While anything waits, a pump at least this often (seconds).
PUMP_EVERY = 1.0

#: Callers whose turn is remembered while nothing of theirs waits, at most.
_TURNS_KEPT = 4096


class QueueFull(Exception):
    """The request's (facade, model) already has ``max-depth`` requests waiting."""


class _Entry:
    """A waiter's live part: what it is waiting with."""

    __slots__ = ("alike", "deferred", "options", "since", "timer")

    def __init__(
        self,
        deferred: Deferred[Option | None],
        options: Callable[[], Sequence[Option]],
        alike: Hashable,
        since: float,
    ) -> None:
        self.deferred = deferred
        self.options = options
        self.alike = alike
        self.since = since
        self.timer: IDelayedCall | None = None


class FleetQueue:
    """Standalone fleet mode's queue (one per process).

    :param load: a node's load state now (the fleet scheduler's standing of it).
    :param parallel: each node's ``[nodes.parallel]``, by (engine, node id).
    """

    def __init__(
        self,
        clock: IReactorTime,
        load: Callable[[NodeId], LoadState],
        options: QueueOptions = DEFAULT_QUEUE,
        parallel: Mapping[NodeId, int] | None = None,
    ) -> None:
        self.options = options
        self._parallel: Mapping[NodeId, int] = parallel or {}
        self._clock = clock
        self._load = load
        self.ledger = Ledger(load, lambda node: self._parallel.get(node))
        self._turns = Turns()
        self._seq = itertools.count()
        self._entries: dict[Waiter, _Entry] = {}
        self._ticker: IDelayedCall | None = None

    @property
    def enabled(self) -> bool:
        return self.options.enabled

    def reconfigure(self, options: QueueOptions, parallel: Mapping[NodeId, int]) -> None:
        """A reload's ``[queue]`` and ``[nodes.parallel]``: requests already waiting keep their
        place; the new bounds apply from the next pump (a ``max-wait`` already running keeps
        its timer)."""
        self.options = options
        self._parallel = parallel
        self.pump()

    def option(self, node: NodeId, model: str | None, listed: frozenset[str]) -> Option:
        """``node`` as the queue weighs it for ``model`` (the node's own key for it): whether
        it holds the model in memory, by its last reading and what was sent to it since. An
        engine that does not say counts as holding it: the queue would otherwise give such a
        node one request at a time."""
        warm = self._load(node).in_memory(model, listed) is not False
        return Option(node, model, warm)

    def waiter(self, caller: str, priority: Priority, group: Hashable, shown: str = "") -> Waiter:
        """A request's place in the turns, kept through its failover; ``shown``: its model as
        the status shows it."""
        waiter = Waiter(next(self._seq), self._clock.seconds(), caller, priority, group)
        waiter.shown = shown
        return waiter

    def depths(self) -> dict[tuple[str, str], int]:
        """(facade, model as shown) -> requests waiting, for the metrics."""
        depths: dict[tuple[str, str], int] = {}
        for waiter in self._entries:
            facade = ""
            if isinstance(waiter.group, tuple):
                facade, _ = waiter.group
            key = (str(facade), waiter.shown)
            depths[key] = depths.get(key, 0) + 1
        return depths

    def take(
        self,
        waiter: Waiter,
        options: Callable[[], Sequence[Option]],
        until: float,
        *,
        alike: Hashable,
    ) -> Deferred[Option | None]:
        """A place for ``waiter``: at once (an already fired Deferred) when one is startable
        and the turns give it, else when one frees; None when ``until`` (clock time) comes
        first. Cancelling the Deferred takes the waiter out.

        :param options: its owners not yet tried this round, in fleet order, asked again at
            every pump (discovery and load states change).
        :param alike: equal for waiters whose options are the same places in some order
            (:func:`~nvpair.control.fairqueue.pump`).
        :raises QueueFull: it would wait, and its group has ``max-depth`` waiting already (a
            request coming back after a failed attempt is never refused for it).
        """
        now = self._clock.seconds()
        entry = _Entry(Deferred(lambda d: self._left(waiter)), options, alike, now)
        self._entries[waiter] = entry
        self.pump()
        if entry.deferred.called:
            return entry.deferred
        if waiter.waited == 0.0 and self.depth(waiter.group) > self.options.max_depth:
            del self._entries[waiter]
            raise QueueFull(waiter.group)
        entry.timer = self._clock.callLater(max(0.0, until - now), self._timed_out, waiter)
        self._tick()
        return entry.deferred

    def release(self, option: Option) -> None:
        """A request that started at ``option`` ended (served, failed or cancelled)."""
        self.ledger.give_back(option)
        self.pump()

    def depth(self, group: Hashable) -> int:
        """Requests of ``group`` waiting now."""
        return sum(1 for waiter in self._entries if waiter.group == group)

    def pump(self) -> None:
        """Hand every place that can be given now to the waiter the turns give it."""
        entries = self._entries
        if not entries:
            return
        now = self._clock.seconds()
        granted = pump(
            list(entries),
            lambda waiter: entries[waiter].options(),
            self.ledger,
            self._turns,
            self.options.collate,
            now,
            alike=lambda waiter: entries[waiter].alike,
        )
        fired: list[tuple[_Entry, Option]] = []
        for waiter, option in granted:
            entry = entries.pop(waiter)
            if entry.timer is not None:
                # It waited (a place given in the pump of its own take is no wait).
                waiter.waited += now - entry.since
                if entry.timer.active():
                    entry.timer.cancel()
            fired.append((entry, option))
        if len(self._turns) > _TURNS_KEPT:
            self._turns.keep({waiter.caller for waiter in entries})
        # Fired once the queue is consistent: a waiter resumed may release or take at once.
        for entry, option in fired:
            entry.deferred.callback(option)

    def _left(self, waiter: Waiter) -> None:
        entry = self._entries.pop(waiter, None)
        if entry is None:
            return
        waiter.waited += self._clock.seconds() - entry.since
        if entry.timer is not None and entry.timer.active():
            entry.timer.cancel()

    def _timed_out(self, waiter: Waiter) -> None:
        entry = self._entries.pop(waiter, None)
        if entry is None:
            return
        entry.timer = None
        waiter.waited += self._clock.seconds() - entry.since
        entry.deferred.callback(None)

    def _tick(self) -> None:
        if self._ticker is None or not self._ticker.active():
            self._ticker = self._clock.callLater(PUMP_EVERY, self._ticked)

    def _ticked(self) -> None:
        self._ticker = None
        self.pump()
        if self._entries:
            self._tick()

    def stop(self) -> None:
        """Shutdown: no pump is left scheduled (the waiting requests are cancelled by their
        jobs)."""
        if self._ticker is not None and self._ticker.active():
            self._ticker.cancel()
        self._ticker = None

    def waiting(self) -> Mapping[Hashable, Sequence[tuple[Waiter, float]]]:
        """Every waiting request by group, in turn, with when it began to wait this time."""
        found: dict[Hashable, list[tuple[Waiter, float]]] = {}
        for waiter in sorted(self._entries, key=self._turns.key):
            found.setdefault(waiter.group, []).append((waiter, self._entries[waiter].since))
        return found


class _NoQueue:
    """Broker mode: nothing waits in the proxy."""

    enabled = False

    def pump(self) -> None:
        pass

    def stop(self) -> None:
        pass


#: What the request path holds: fleet mode's queue, or broker mode's none.
Queueing = FleetQueue | _NoQueue

#: The queue of a mode without one.
NO_QUEUE = _NoQueue()
