"""Workload lifecycle events (docs/request-path.md#workload-lifecycle,
docs/broker-protocol.md#workload-events).

``submitted`` covers the whole pre-commit life — at admission, at each dispatch (with
``scheduledOn``) and between attempts (cleared) — ``started`` is the commit, and exactly one
terminal event ends every admitted inference request. ``seq`` counts one workload's events
from 1 so that a retry returning to a placement it already used is not mistaken for a
redelivery by the workload-manager's dedup.
"""

from __future__ import annotations

import enum
import itertools
import os
from collections.abc import Callable

from attrs import define, field

from nvpair.control.affinity import Verdict
from nvpair.engines.caller import Caller
from nvpair.engines.inferstats import Stats

Emit = Callable[[str, dict[str, object]], None]


class State(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


def new_run_id() -> str:
    """16 hex characters, fixed for the process's life."""
    return os.urandom(8).hex()


class Workloads:
    """Issues workload ids and run id for the process.

    :param emit: sends ``(method, params)`` to the broker (or, standalone, to the log).
    :param now_ms: the clock, in Unix milliseconds.
    :param wanted: whether anyone consumes the events now; when not, none is built (fleet
        mode logs them at debug level only).
    """

    def __init__(
        self,
        emit: Emit,
        now_ms: Callable[[], int],
        run_id: str | None = None,
        wanted: Callable[[], bool] = lambda: True,
    ) -> None:
        self._emit = emit
        self._wanted = wanted
        self._now_ms = now_ms
        self.run_id = run_id or new_run_id()
        self._ids = itertools.count(1)

    def admit(
        self,
        engine: str,
        model: str,
        originated_from: str = "",
        caller: Caller | None = None,
        facade: str = "",
    ) -> Workload:
        """A new admitted inference request: emits its first ``submitted``.

        :param caller: who sent it, where fleet mode's ``[access]`` is in force.
        :param facade: the facade it came through, when that is not its engine's own (the
            ``openai`` facade)."""
        workload = Workload(
            emit=self._emit,
            wanted=self._wanted,
            now_ms=self._now_ms,
            id=str(next(self._ids)),
            run_id=self.run_id,
            engine=engine,
            model=model,
            originated_from=originated_from,
            created_at=self._now_ms(),
            caller=caller,
            facade=facade or engine,
        )
        workload.submitted(None)
        return workload


@define(eq=False)
class Workload:
    """One admitted inference request's events."""

    emit: Emit
    wanted: Callable[[], bool]
    now_ms: Callable[[], int]
    id: str
    run_id: str
    engine: str
    model: str
    originated_from: str
    created_at: int
    state: State = State.QUEUED
    scheduled_on: str | None = None
    started_at: int | None = None
    completed_at: int | None = None
    error: str | None = None
    seq: int = 0
    stats: Stats | None = field(default=None)
    #: Who sent it, where ``[access]`` is in force; its key's name is the events' ``key``.
    caller: Caller | None = None
    #: The facade it came through (the ``openai`` facade, or its engine's own).
    facade: str = ""
    #: Milliseconds it waited in fleet mode's queue, if it waited (docs/fleet-scheduling.md
    #: #the-queue).
    queued_ms: int | None = None
    #: What the order did with its conversation, judged at its first dispatch (fleet mode with
    #: affinity, a request with prefix keys; docs/fleet-scheduling.md
    #: #what-the-operator-sees-of-affinity).
    affinity: Verdict | None = None

    @property
    def ended(self) -> bool:
        return self.completed_at is not None

    def submitted(self, node: str | None) -> None:
        """Queued: at admission and between attempts (``node`` None), at each dispatch."""
        self.scheduled_on = node
        self._send("workload:submitted")

    def started(self, node: str) -> None:
        """Committed: the engine is producing the answer."""
        self.state = State.RUNNING
        self.scheduled_on = node
        self.started_at = self.now_ms()
        self._send("workload:started")

    def terminal(self, state: State, error: str | None, stats: Stats | None) -> None:
        """The one terminal event; later calls are ignored."""
        if self.ended:
            return
        self.state = state
        self.error = error
        self.stats = stats
        self.completed_at = self.now_ms()
        method = "workload:completed" if state is State.COMPLETED else "workload:errored"
        self._send(method)

    def info(self) -> dict[str, object]:
        info: dict[str, object] = {
            "id": self.id,
            "model": self.model,
            "engine": self.engine,
            "runId": self.run_id,
            "state": self.state.value,
            "originatedFrom": self.originated_from,
            "createdAt": self.created_at,
            "startedAt": self.started_at,
            "completedAt": self.completed_at,
            "error": self.error,
            "requesterId": None,
            "seq": self.seq,
        }
        if self.scheduled_on:
            info["scheduledOn"] = self.scheduled_on
        if self.stats is not None:
            info["stats"] = self.stats.to_json()
        if self.caller is not None:
            info["key"] = self.caller.name
        return info

    def _send(self, method: str) -> None:
        self.seq += 1
        if self.wanted():
            self.emit(method, {"workloadInfo": self.info()})
