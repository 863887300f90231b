# -*- test-case-name: tests.sim.test_sim_queue -*-
"""Which answers a simulated engine runs now and which wait their turn: llama-server's slots and
deferred tasks, Ollama's ``OLLAMA_NUM_PARALLEL``, LM Studio's Max Concurrent Predictions
(docs/fleet-scheduling.md#simulated-engines).

An answer that runs on a model (a completion, a chat, an embedding) takes one of ``parallel``
places on that model's *lane*; with every place taken it waits, with no bound and no timeout,
and no HTTP answer is given meanwhile. The rules are the engines':

- **llama-server** (one lane: its one model): ``parallel`` is ``-np``. A task that finds no idle
  slot is deferred (``server_queue::defer``). When a slot is released, one deferred task is
  tried: the first that asked for that slot (``id_slot``), else the oldest
  (``pop_deferred_task``). A task pinned to a slot that is still busy is deferred again, at the
  back, even when another slot is idle; a new task takes an idle slot at once.
- **Ollama** (a lane per loaded model): ``parallel`` is ``OLLAMA_NUM_PARALLEL``, the weight of
  each runner's semaphore; its waiters are served in order (``golang.org/x/sync/semaphore``).
- **LM Studio** (a lane per model): ``parallel`` is the model's Max Concurrent Predictions;
  the rest are queued, in order as far as its documentation says.

A waiter that leaves (its client went away) is dropped from the line at once and never runs;
llama-server notices within about a second, which is not modelled. This module keeps the order
and the counts only: what a place is (a llama.cpp slot and its kept prompt) is the engine's
business (:mod:`nvpair.sim.promptcache`), asked through ``slot_idle``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import attrs


@attrs.define(eq=False)
class Turn:
    """One answer's place, from :meth:`Turns.take` until :meth:`Turns.end`.

    :ivar lane: the model it runs on (llama.cpp: one lane for the server's model).
    :ivar pin: the slot it asked for (llama.cpp ``id_slot``), None for any.
    :ivar running: it has its place (at once, or when its turn came).
    :ivar started: called when a turn that waited gets its place; set it when
        :meth:`Turns.take` returned one that is not running.
    """

    lane: str
    pin: int | None = None
    running: bool = False
    started: Callable[[], None] | None = None
    ended: bool = False


class Turns:
    """The places of one engine, per lane, and the lines of those waiting for one.

    :param parallel: places per lane.
    :param slot_idle: whether a slot is idle now (llama.cpp's pinned tasks); None: no pins.
    """

    def __init__(self, parallel: int, slot_idle: Callable[[int], bool] | None = None) -> None:
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        self.parallel = parallel
        self._slot_idle = slot_idle
        self._running: dict[str, int] = {}
        self._lines: dict[str, deque[Turn]] = {}

    # -- questions ------------------------------------------------------------------------------

    def running(self, lane: str | None = None) -> int:
        """Answers holding a place (on ``lane``, or on any)."""
        if lane is not None:
            return self._running.get(lane, 0)
        return sum(self._running.values())

    def waiting(self, lane: str | None = None) -> int:
        """Answers waiting for a place (on ``lane``, or on any)."""
        if lane is not None:
            return len(self._lines.get(lane, ()))
        return sum(len(line) for line in self._lines.values())

    # -- answers --------------------------------------------------------------------------------

    def take(self, lane: str, pin: int | None = None) -> Turn:
        """An answer asks for a place on ``lane``: it runs at once when one is free for it,
        else it joins the end of the line."""
        turn = Turn(lane, pin)
        if self._free(turn):
            self._start(turn)
        else:
            self._lines.setdefault(lane, deque()).append(turn)
        return turn

    def end(self, turn: Turn, slot: int | None = None) -> None:
        """The answer ended (delivered, failed or abandoned), or left the line; twice is once.

        :param slot: the slot it ran in (llama.cpp), for the waiter that asked for that slot.
        """
        if turn.ended:
            return
        turn.ended = True
        if not turn.running:
            line = self._lines.get(turn.lane)
            if line is not None and turn in line:
                line.remove(turn)
            return
        self._running[turn.lane] -= 1
        line = self._lines.get(turn.lane)
        if not line:
            return
        # One place freed, one waiter tried, as ``pop_deferred_task`` does.
        chosen = next((w for w in line if slot is not None and w.pin == slot), line[0])
        line.remove(chosen)
        if not self._free(chosen):
            line.append(chosen)
            return
        self._start(chosen)
        # Last, so a waiter whose answer ends at once finds the bookkeeping done.
        if chosen.started is not None:
            chosen.started()

    def clear(self) -> None:
        """The engine stops: nobody waiting will run."""
        for line in self._lines.values():
            for turn in line:
                turn.ended = True
        self._lines.clear()

    # -- the rules ------------------------------------------------------------------------------

    def _free(self, turn: Turn) -> bool:
        if self._running.get(turn.lane, 0) >= self.parallel:
            return False
        return turn.pin is None or self._slot_idle is None or self._slot_idle(turn.pin)

    def _start(self, turn: Turn) -> None:
        turn.running = True
        self._running[turn.lane] = self._running.get(turn.lane, 0) + 1
