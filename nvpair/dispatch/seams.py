"""The request path's seams: what it asks of the mode it runs in, and whom it reports to.

The request path never asks whether a broker or the fleet file drives the process, nor whether
an admin listener runs. It schedules through one :class:`Scheduling` strategy and reports
through two observers (:class:`WorkloadRecorder`, :class:`RequestCounter`); the process wires
one implementation of each (docs/request-path.md#seams):

- **broker mode** schedules with :class:`PriorityScheduling` here: the scheduler's priority list
  from the control state, no wait for an owner beyond the job deadline, no health feedback (the
  broker's own sweep judges nodes). Standalone fleet mode schedules with
  :class:`nvpair.fleet.scheduling.FleetScheduler`: warm-first order, passive health,
  ``--owner-wait`` (docs/fleet-scheduling.md).
- **with an admin listener** :class:`nvpair.observe.recent.RecentWorkloads` records and
  :class:`nvpair.observe.metrics.Metrics` counts; without one, :data:`NOT_RECORDED` and
  :data:`NOT_COUNTED` do nothing, shared by every request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from nvpair.control.routing import Plan, plan
from nvpair.control.state import ControlState, Node
from nvpair.dispatch.attempt import Outcome
from nvpair.dispatch.workload import Workload
from nvpair.engines.inferstats import Stats


class Scheduling(Protocol):
    """How a round's candidates are ordered and what an attempt's outcome teaches: the part of
    the request path that differs between broker mode and standalone fleet mode."""

    @property
    def owner_wait(self) -> float:
        """Seconds the wait for an owner may last once every owner has gone (0: until the job
        deadline) (docs/retry-budget.md#waiting-for-an-owner)."""
        ...

    def plan(
        self,
        engine: str,
        eligible: Sequence[Node],
        pin: str | None,
        model_key: str | None,
        reservations: Mapping[str, int],
        prefix: Sequence[int] = (),
    ) -> Plan:
        """This round's candidates among ``eligible``, in order, and the node to reserve;
        ``prefix``: the request's prefix keys, for affinity (:attr:`Admitted.prefix`)."""
        ...

    def plan_across(
        self,
        eligible: Sequence[Node],
        model_key: Callable[[str], str | None],
        reservations: Mapping[str, int],
        prefix: Sequence[int] = (),
    ) -> Plan:
        """A round over several engines' nodes (the ``openai`` facade): no pin, each node
        judged by its own engine's ``model_key(engine)`` (docs/openai-facade.md#owners)."""
        ...

    def owners_down(self, engine: str, model_key: str | None) -> list[str]:
        """The nodes known to have listed ``model_key`` that are down now, by id: what a
        refusal for want of an owner names."""
        ...

    def starting(self, engine: str) -> bool:
        """Whether a node of ``engine`` the mode knows of has yet to answer its first poll, or
        says it is loading its model: a health route with no node to go to answers as the
        engine does while it loads (docs/fleet-scheduling.md#before-the-first-poll)."""
        ...

    def dispatching(self, engine: str, node: str, model_key: str | None) -> bool:
        """An attempt to ``node`` starts now; whether it is the node's trial after a hold-back
        (handed back to :meth:`failed`)."""
        ...

    def succeeded(self, engine: str, node: str) -> None:
        """The attempt's node answered."""
        ...

    def failed(self, engine: str, node: str, trial: bool, why: str) -> None:
        """The attempt's node failed, ``why`` in a few words (``status 503``, ``transport``)."""
        ...

    def answered(
        self,
        engine: str,
        node: str,
        model_key: str | None,
        prefix: Sequence[int],
        stats: Stats | None,
        affine: bool,
    ) -> None:
        """``node`` served the request below 400, its body relayed; ``stats``: what was read
        from it; ``affine``: the plan put the node first for affinity
        (docs/fleet-scheduling.md#conversations-go-where-their-cache-is)."""
        ...


class PriorityScheduling:
    """Broker mode: the scheduler's priority list orders a round (docs/candidate-order.md#order);
    the broker judges nodes and sweeps the workloads of those it loses, so the request path
    tells it nothing and waits for an owner until the job deadline."""

    owner_wait = 0.0

    def __init__(self, control: ControlState) -> None:
        self._control = control

    def plan(
        self,
        engine: str,
        eligible: Sequence[Node],
        pin: str | None,
        model_key: str | None,
        reservations: Mapping[str, int],
        prefix: Sequence[int] = (),
    ) -> Plan:
        return plan(eligible, pin, self._control.priority, reservations)

    def plan_across(
        self,
        eligible: Sequence[Node],
        model_key: Callable[[str], str | None],
        reservations: Mapping[str, int],
        prefix: Sequence[int] = (),
    ) -> Plan:
        return plan(eligible, None, self._control.priority, reservations)

    def owners_down(self, engine: str, model_key: str | None) -> list[str]:
        # A broker's discovery says nothing of the nodes that left it.
        return []

    def starting(self, engine: str) -> bool:
        # No polls: a broker's discovery is all there is to know of its nodes.
        return False

    def dispatching(self, engine: str, node: str, model_key: str | None) -> bool:
        return False

    def succeeded(self, engine: str, node: str) -> None:
        pass

    def failed(self, engine: str, node: str, trial: bool, why: str) -> None:
        pass

    def answered(
        self,
        engine: str,
        node: str,
        model_key: str | None,
        prefix: Sequence[int],
        stats: Stats | None,
        affine: bool,
    ) -> None:
        # The scheduler's priority list ranks; no affinity in broker mode.
        pass


class AttemptLog(Protocol):
    """One admitted workload's record: told how each of its attempts ended."""

    def attempt_ended(self, node: str, outcome: Outcome) -> None: ...

    def truncated(self) -> None: ...


class WorkloadRecorder(Protocol):
    """Where admitted workloads and their attempts are recorded (``/status``'s recent list)."""

    def admitted(self, workload: Workload) -> AttemptLog: ...


class RequestCounter(Protocol):
    """What ``/metrics`` counts: every attempt and every request as it ends."""

    def attempt_ended(
        self, engine: str, node: str, outcome: Outcome, cut: bool = False
    ) -> None: ...

    def request_ended(
        self,
        engine: str,
        route: str,
        outcome: str,
        dispatches: int,
        seconds: float,
        first_byte: float | None,
        stats: Stats | None = None,
    ) -> None: ...

    def queue_waited(self, engine: str, seconds: float) -> None:
        """A request that waited ``seconds`` in fleet mode's queue ended."""

    def key_request_ended(self, key: str, engine: str, outcome: str) -> None:
        """A request that came with the fleet key ``key`` ended (docs/lan.md#keys)."""

    def affinity_judged(self, engine: str, node: str, result: str) -> None:
        """A request was first dispatched to ``engine``'s ``node``, affinity's ``result``
        (``followed``, ``moved``, ``new``; docs/fleet-scheduling.md
        #what-the-operator-sees-of-affinity)."""

    def cached_read(self, engine: str, node: str, tokens: int) -> None:
        """``engine`` on ``node`` answered a request reading ``tokens`` of its prompt from its
        cache."""


class _NotRecorded:
    """No admin listener: nothing recorded, and the one log every workload shares."""

    def admitted(self, workload: Workload) -> AttemptLog:
        return self

    def attempt_ended(self, node: str, outcome: Outcome) -> None:
        pass

    def truncated(self) -> None:
        pass


class _NotCounted:
    """No admin listener: nothing counted."""

    def attempt_ended(self, engine: str, node: str, outcome: Outcome, cut: bool = False) -> None:
        pass

    def request_ended(
        self,
        engine: str,
        route: str,
        outcome: str,
        dispatches: int,
        seconds: float,
        first_byte: float | None,
        stats: Stats | None = None,
    ) -> None:
        pass

    def queue_waited(self, engine: str, seconds: float) -> None:
        pass

    def key_request_ended(self, key: str, engine: str, outcome: str) -> None:
        pass

    def affinity_judged(self, engine: str, node: str, result: str) -> None:
        pass

    def cached_read(self, engine: str, node: str, tokens: int) -> None:
        pass


#: The null observers, shared by every request of a process without an admin listener.
NOT_RECORDED = _NotRecorded()
NOT_COUNTED = _NotCounted()
#: The log of a job with no workload recorded (every route but inference, or no listener).
NO_LOG: AttemptLog = NOT_RECORDED
