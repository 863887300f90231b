# -*- test-case-name: tests.sim.test_sim_memory -*-
"""Which models a simulated engine holds in memory: the cold-start and capacity knobs, and the
queue of Ollama's scheduler in front of them.

A model that is not in memory answers its first request only after ``load_delay``; it stays in
memory while requests run on it and for ``keep_alive`` after the last one ends, then it is
unloaded and the next request loads it again (Ollama's ``keep_alive``, LM Studio's idle TTL).

The rules are those of Ollama's scheduler (v0.33, ``server/sched.go``: ``getRunner``,
``processPending``, ``findRunnerToUnload``), which LM Studio's simulation shares:

- **A request for a model in memory and ready goes straight to it** (``getRunner`` finds the
  runner in ``loaded``), whatever waits in the queue, even when that model has been chosen to
  make room: steady traffic to it keeps it, and delays the load waiting for its room.
- **Any other request joins the pending queue**, served one at a time in arrival order. Its
  model loads if there is room, and nothing behind it moves until that load is done (one load
  at a time); requests for the model being loaded then find it ready.
- ``max_loaded`` bounds how many models are in memory at once, loading ones included, as
  ``OLLAMA_MAX_LOADED_MODELS`` (default three per GPU) and, in practice, the GPU's memory. A
  load with no room evicts first the first of the models in memory, ordered by keep-alive
  (shortest first) and then by the model's file path, that has no request running and is not
  loading. Ollama's path is the model's blob, named by its digest: the sim stands in the
  SHA-256 of the model's name, an order that has nothing to do with how recently or how much a
  model was used.
- When every model in memory is busy, Ollama picks the first of them in that order anyway and
  waits: that model is unloaded as soon as its last request ends (its keep-alive no longer
  applies), or room appears sooner when another model's keep-alive runs out. The queue behind
  waits too.
- ``max_queue`` is ``OLLAMA_MAX_QUEUE`` (default 512), the pending queue's capacity: a request
  that would join a full queue is refused (:meth:`Memory.refuses`; Ollama answers 503). The
  request being scheduled is out of the queue; one that left keeps its place until reached.
  A request that goes straight to a ready model is never refused.

How many requests run on a model at once (``OLLAMA_NUM_PARALLEL``) is the engine's
(:mod:`nvpair.sim.turns`): a request waiting for its turn holds its model all the same, as
Ollama counts it in the runner's references. Not modelled: the VRAM each model takes
(``max_loaded`` is a count), the seconds Ollama may wait for the GPU's memory to be reported
free after an unload, a request's own ``keep_alive`` (one for every model), reloads for changed
options.

Time is the engine's clock. A timer lets the queue go on when a load ends, and, while a load
waits for room, at the keep-alive's end of a model that went idle meanwhile; a request ending
lets it go on at once.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Iterable

import attrs
from twisted.internet.interfaces import IDelayedCall, IReactorTime


@attrs.frozen
class Resident:
    """A model in memory now.

    :param model: the model as configured.
    :param ready_at: when its load finishes (or finished).
    :param expires_at: when it will be unloaded if nothing uses it meanwhile; None: never.
    :param in_use: requests running on it.
    """

    model: str
    ready_at: float
    expires_at: float | None
    in_use: int

    def loading(self, now: float) -> bool:
        return now < self.ready_at


@attrs.define(eq=False)
class Claim:
    """One request's hold on a model, from :meth:`Memory.claim` to :meth:`Memory.release`.

    :ivar model: the model it runs on.
    :ivar wait: seconds from when it was let in until the model is ready (0: at once); None
        while it waits for room, behind a load that needs it.
    :ivar admitted: called with :attr:`wait` when a claim that waited is let in; set it when
        :meth:`Memory.claim` returned one with no wait yet.
    """

    model: str
    wait: float | None = None
    admitted: Callable[[float], None] | None = None
    released: bool = False


def _path(model: str) -> str:
    """What stands in for the model's blob path in Ollama's eviction order."""
    return hashlib.sha256(model.encode("utf-8")).hexdigest()


class Memory:
    """The models a simulated engine holds in memory, and the queue of requests for the others.

    :param clock: the engine's clock (and its timers).
    :param load_delay: seconds a model takes to load.
    :param keep_alive: seconds a model stays in memory after its last request ends; None: for
        good.
    :param warm: the models in memory (and ready) at the start.
    :param max_loaded: how many models may be in memory at once; None: any number.
    :param max_queue: how many requests the pending queue holds (``OLLAMA_MAX_QUEUE``); None:
        any number.
    """

    def __init__(
        self,
        clock: IReactorTime,
        load_delay: float,
        keep_alive: float | None,
        warm: Iterable[str],
        max_loaded: int | None = None,
        max_queue: int | None = None,
    ) -> None:
        if max_loaded is not None and max_loaded < 1:
            raise ValueError("max_loaded must be at least 1")
        if max_queue is not None and max_queue < 0:
            raise ValueError("max_queue must not be negative")
        self._clock = clock
        self._now = clock.seconds
        self.load_delay = load_delay
        self.keep_alive = keep_alive
        self.max_loaded = max_loaded
        self.max_queue = max_queue
        # In memory, loading included, in the order loaded: model -> when it is (was) ready.
        self._ready: dict[str, float] = {}
        self._users: dict[str, int] = {}
        self._idle_since: dict[str, float] = {}
        # Chosen to make room while busy: unloaded when its last request ends.
        self._evicting: set[str] = set()
        # The pending queue, in arrival order: requests not let in yet, and those that left
        # before they were reached. The first waits for room while _waiting_for_room.
        self._queue: deque[Claim] = deque()
        self._waiting_for_room = False
        # The model the queue loaded last: nothing behind it moves until it is ready.
        self._loaded_last: str | None = None
        self._timer: IDelayedCall | None = None
        self.loads = 0
        """How many loads have started (cold starts), the warm models at the start not counted."""
        self.evictions = 0
        """How many models were unloaded to make room for another (keep-alives not counted)."""
        start = self._now()
        for model in warm:
            self._ready[model] = start
            self._idle_since[model] = start
        if max_loaded is not None and len(self._ready) > max_loaded:
            raise ValueError(f"{len(self._ready)} warm models, more than max_loaded {max_loaded}")

    # -- questions ------------------------------------------------------------------------------

    def resident(self) -> list[Resident]:
        """The models in memory now, loading ones included, in the order they were loaded."""
        self._expire()
        entries = []
        for model, ready_at in self._ready.items():
            users = self._users.get(model, 0)
            since = self._idle_since.get(model)
            expires = None
            if self.keep_alive is not None:
                # While in use (or loading) the keep-alive has not started: it would end a
                # whole keep-alive after now at the earliest.
                start = since if since is not None and not users else self._now()
                expires = max(start, ready_at) + self.keep_alive
            entries.append(Resident(model, ready_at, expires, users))
        return entries

    def in_memory(self, model: str) -> bool:
        """Loaded and ready (a model still loading is not)."""
        self._expire()
        ready_at = self._ready.get(model)
        return ready_at is not None and ready_at <= self._now()

    def loading(self, model: str) -> bool:
        """A load of ``model`` has started and not finished."""
        ready_at = self._ready.get(model)
        return ready_at is not None and ready_at > self._now()

    @property
    def waiting(self) -> int:
        """Requests not let in yet: in the pending queue, or first in it waiting for room."""
        return sum(1 for claim in self._queue if not claim.released)

    @property
    def pending(self) -> int:
        """What fills Ollama's pending queue (``pendingReqCh``): every request not yet reached,
        those that left included, but not the one being scheduled."""
        pending = len(self._queue) - (1 if self._waiting_for_room else 0)
        loading = self._loading()
        if loading is not None:
            # Let in ahead of time here, but in Ollama still queued until its load is done:
            # all but the request that started the load.
            pending += max(0, self._users.get(loading, 0) - 1)
        return pending

    def refuses(self, model: str) -> bool:
        """A request for ``model`` now would find the pending queue full (Ollama: 503)."""
        if self.max_queue is None or self.in_memory(model):
            return False
        # An idle scheduler takes the request itself, even through a queue of no places.
        idle = not self._queue and self._loading() is None
        return self.pending >= self.max_queue and not idle

    # -- requests -------------------------------------------------------------------------------

    def claim(self, model: str) -> Claim:
        """A request starts on ``model`` (the caller asked :meth:`refuses` first).

        A model in memory and ready lets it in at once; otherwise it joins the pending queue,
        and is let in when reached: its model then starts loading, or is loading already.
        :attr:`Claim.wait` is the seconds until it can run once let in (0 when the model is
        ready), None until :attr:`Claim.admitted` is told.
        """
        claim = Claim(model)
        if self.in_memory(model):
            self._admit(claim)
            self._arm()
            return claim
        self._queue.append(claim)
        self._drain()
        return claim

    def release(self, claim: Claim) -> None:
        """The claim's request ended (answered, failed or abandoned); twice is once."""
        if claim.released:
            return
        claim.released = True
        if claim.wait is None:
            # Gone before it was reached: it keeps its place in Ollama's queue until then, and
            # a model already chosen to make room for it is unloaded all the same.
            self._drain()
            return
        model = claim.model
        users = self._users.get(model, 0) - 1
        if users > 0:
            self._users[model] = users
            return
        self._users.pop(model, None)
        if model in self._evicting:
            self._evict(model)
        elif model in self._ready:
            # The keep-alive starts once the model is ready and idle.
            self._idle_since[model] = max(self._now(), self._ready[model])
        self._drain()

    def load(self, model: str) -> None:
        """Start loading ``model`` now (a server restarting), whatever was in memory."""
        self._ready[model] = self._now() + self.load_delay
        self._idle_since[model] = self._ready[model]
        self.loads += 1

    def unload(self, model: str | None = None) -> None:
        """Drop ``model`` (None: every model) from memory, as ``keep_alive: 0`` would."""
        for name in [model] if model is not None else list(self._ready):
            self._forget(name)
        self._drain()

    # -- the scheduler --------------------------------------------------------------------------

    def _forget(self, model: str) -> None:
        self._ready.pop(model, None)
        self._idle_since.pop(model, None)
        self._evicting.discard(model)

    def _evict(self, model: str) -> None:
        self._forget(model)
        self.evictions += 1

    def _expire(self) -> None:
        """Forget every model whose keep-alive ran out with nothing using it."""
        if self.keep_alive is None:
            return
        now = self._now()
        for model, since in list(self._idle_since.items()):
            if not self._users.get(model) and now >= since + self.keep_alive:
                self._forget(model)

    def _room(self) -> bool:
        return self.max_loaded is None or len(self._ready) < self.max_loaded

    def _idle(self, model: str) -> bool:
        return not self._users.get(model) and self._ready[model] <= self._now()

    def _loading(self) -> str | None:
        """The model the queue is loading now, if any: nothing behind it moves meanwhile."""
        model = self._loaded_last
        if model is not None and self._ready.get(model, 0.0) > self._now():
            return model
        return None

    def _victim(self) -> str:
        """``findRunnerToUnload``: the first idle model by keep-alive then path, else the first
        model by that order (every model shares this memory's keep-alive)."""
        ordered = sorted(self._ready, key=_path)
        return next((model for model in ordered if self._idle(model)), ordered[0])

    def _admit(self, claim: Claim) -> None:
        model = claim.model
        self._users[model] = self._users.get(model, 0) + 1
        self._idle_since.pop(model, None)
        claim.wait = max(0.0, self._ready[model] - self._now())

    def _drain(self) -> None:
        """Let in what the pending queue can let in now, first come first."""
        self._expire()
        if self._waiting_for_room and self._room():
            self._waiting_for_room = False
        let_in: list[Claim] = []
        while self._queue and not self._waiting_for_room:
            claim = self._queue[0]
            if claim.released:
                self._queue.popleft()
                continue
            model = claim.model
            loading = self._loading()
            if loading is not None and loading != model:
                break  # one load at a time: the rest waits for it to end
            if model not in self._ready:
                if not self._room():
                    victim = self._victim()
                    if self._idle(victim):
                        self._evict(victim)
                    else:
                        # Ollama waits for that one model to go idle; the queue waits too.
                        self._evicting.add(victim)
                        self._waiting_for_room = True
                        break
                self._ready[model] = self._now() + self.load_delay
                self._loaded_last = model
                self.loads += 1
            self._admit(claim)
            self._queue.popleft()
            let_in.append(claim)
        self._arm()
        # After the bookkeeping, so a callback may release its claim at once. A claim let in
        # by its own claim() has no callback yet: it reads its wait.
        for claim in let_in:
            if claim.admitted is not None and claim.wait is not None:
                claim.admitted(claim.wait)

    def close(self) -> None:
        """The engine stops: no timer of its outlives it."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _arm(self) -> None:
        """A timer at the next moment the queue may move by itself: the end of the load it
        waits for, or, while a load waits for room, the end of the first keep-alive to run out
        (which makes room sooner than the busy model chosen to go)."""
        due: float | None = None
        loading = self._loading()
        if loading is not None and self.waiting:
            due = self._ready[loading]
        elif self._waiting_for_room and self.keep_alive is not None:
            idle = [
                since for model, since in self._idle_since.items() if not self._users.get(model)
            ]
            if idle:
                due = min(idle) + self.keep_alive
        if self._timer is not None and self._timer.active():
            if due is not None and self._timer.getTime() == due:
                return
            self._timer.cancel()
        self._timer = None
        if due is not None:
            self._timer = self._clock.callLater(max(0.0, due - self._now()), self._drain)
