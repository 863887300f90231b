# -*- test-case-name: tests.test_sim_memory -*-
"""Which models a simulated engine holds in memory: the cold-start knob.

A model that is not in memory answers its first request only after ``load_delay``; it stays in
memory while requests run on it and for ``keep_alive`` after the last one ends, then it is
unloaded and the next request loads it again (Ollama's ``keep_alive``, LM Studio's idle TTL).
Requests that arrive while a model loads wait for that same load. Time is the engine's clock;
nothing is scheduled: every question is answered from the times recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs


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


class Memory:
    """The models a simulated engine holds in memory.

    :param now: the engine's clock.
    :param load_delay: seconds a model takes to load.
    :param keep_alive: seconds a model stays in memory after its last request ends; None: for
        good.
    :param warm: the models in memory (and ready) at the start.
    """

    def __init__(
        self,
        now: Callable[[], float],
        load_delay: float,
        keep_alive: float | None,
        warm: Iterable[str],
    ) -> None:
        self._now = now
        self.load_delay = load_delay
        self.keep_alive = keep_alive
        self._ready: dict[str, float] = {}
        self._users: dict[str, int] = {}
        self._idle_since: dict[str, float] = {}
        self.loads = 0
        """How many loads have started (cold starts), the warm models at the start not counted."""
        start = now()
        for model in warm:
            self._ready[model] = start
            self._idle_since[model] = start

    def _expire(self) -> None:
        """Forget every model whose keep-alive ran out with nothing using it."""
        if self.keep_alive is None:
            return
        now = self._now()
        for model, since in list(self._idle_since.items()):
            if not self._users.get(model) and now >= since + self.keep_alive:
                del self._idle_since[model]
                self._ready.pop(model, None)

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

    def use(self, model: str) -> float:
        """A request starts on ``model``: seconds until it can run (0 when already loaded).

        A model not in memory starts loading now; one already loading is waited for.
        """
        self._expire()
        now = self._now()
        if model not in self._ready:
            self._ready[model] = now + self.load_delay
            self.loads += 1
        self._users[model] = self._users.get(model, 0) + 1
        self._idle_since.pop(model, None)
        return max(0.0, self._ready[model] - now)

    def done(self, model: str) -> None:
        """A request on ``model`` ended (answered, failed or abandoned)."""
        users = self._users.get(model, 0) - 1
        if users > 0:
            self._users[model] = users
            return
        self._users.pop(model, None)
        if model in self._ready:
            # The keep-alive starts once the model is ready and idle.
            self._idle_since[model] = max(self._now(), self._ready[model])

    def load(self, model: str) -> None:
        """Start loading ``model`` now (a server restarting), whatever was in memory."""
        self._ready[model] = self._now() + self.load_delay
        self._idle_since[model] = self._ready[model]
        self.loads += 1

    def unload(self, model: str | None = None) -> None:
        """Drop ``model`` (None: every model) from memory, as ``keep_alive: 0`` would."""
        for name in [model] if model is not None else list(self._ready):
            self._ready.pop(name, None)
            self._idle_since.pop(name, None)
