"""One admitted request's life (:class:`Job`) and what every route's server works with.

A job is the request's cancellation scope: the requester leaving, a client that stopped
reading, or shutdown each cancel it with an :class:`Ending`, and outcome classification reads
that reason rather than inferring it from an exception (an attempt's own cancellation must
never look like the requester leaving). :class:`Services` is the set of process-wide pieces
the servers in :mod:`nvpair.dispatch.failover`, :mod:`nvpair.dispatch.forwarding` and
:mod:`nvpair.dispatch.fleetwide` share.

Each of a job's fields has one owner, the only code that sets it
(``tests/dispatch/test_job.py`` holds them to it):

- ``admitted``, ``request``, ``outgoing``, ``created``: :mod:`nvpair.dispatch.requestpath`, when
  it makes the job;
- ``deferred`` (:meth:`Job.run`), ``ending`` (:meth:`Job.cancel`), ``refused``
  (:meth:`Job.refuse`), ``reservation`` (:meth:`Job.reserve`, :meth:`Job.release`),
  ``served_status`` and ``committed_at`` (:meth:`Job.served`): this module's methods, whoever
  calls them;
- ``budget``, ``workload``, ``trail`` and ``queued``: :mod:`nvpair.dispatch.failover`, the
  inference loop (the only route that spends a budget, is admitted as a workload or waits in
  the fleet's queue);
- ``stats``: :mod:`nvpair.dispatch.delivery`, read from the body it relays; ``node``,
  ``node_engine`` and ``dispatches`` there too, as each dispatch starts, and ``cut`` as its
  answer ends (for the access log).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from attrs import define, frozen
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure

from nvpair.common.reasons import Reason
from nvpair.control.reservations import Reservation, Reservations
from nvpair.control.state import ControlState
from nvpair.dispatch.activity import NodeActivity
from nvpair.dispatch.attempt import Attempts, Outgoing
from nvpair.dispatch.budget import Bounds, RetryBudget
from nvpair.dispatch.candidates import Candidates
from nvpair.dispatch.queueing import NO_QUEUE, Queueing
from nvpair.dispatch.seams import NO_LOG, AttemptLog, RequestCounter, Scheduling, WorkloadRecorder
from nvpair.dispatch.workload import Workload, Workloads
from nvpair.engines.inferstats import Stats
from nvpair.engines.table import RouteClass
from nvpair.facades.answers import write_error
from nvpair.facades.facade import Admitted
from nvpair.wire.headers import strip_hop_by_hop
from nvpair.wire.message import Fields
from nvpair.wire.web import ProxiedRequest, UpstreamClient


class Ending(enum.Enum):
    """Why a request stopped early (the parent scope's cancellation reason)."""

    REQUESTER_GONE = "requester-gone"
    CLIENT_WRITE_TIMEOUT = "client-write-timeout"
    SHUTDOWN = "shutdown"


@define(eq=False)
class Job:
    """One request's life: its scope, its budget and what it has answered so far."""

    admitted: Admitted
    request: ProxiedRequest
    #: What every attempt sends (:func:`outgoing_of`), made once with the job.
    outgoing: Outgoing
    created: float
    budget: RetryBudget
    ending: Ending | None = None
    reservation: Reservation | None = None
    deferred: Deferred[None] | None = None
    workload: Workload | None = None
    #: The status of the engines' answer served (relayed from one node at the commit, or the
    #: fleet's, merged or intersected), if one was.
    served_status: int | None = None
    #: The reason of the proxy-generated answer, if the proxy answered.
    refused: Reason | None = None
    stats: Stats | None = None
    #: Where this workload's attempts are recorded for the admin ``/status``; one shared log
    #: that keeps nothing when no admin listener runs (or the route has no workload).
    trail: AttemptLog = NO_LOG
    #: When the answer served began (the commit), on the process clock.
    committed_at: float | None = None
    #: The node last dispatched to: the one whose answer (or failure) the client got.
    node: str | None = None
    #: That node's engine (the ``openai`` facade reaches several).
    node_engine: str | None = None
    #: Dispatches made, on any route.
    dispatches: int = 0
    #: Seconds the request waited in fleet mode's queue, if it waited.
    queued: float | None = None
    #: The answer served was cut by its engine before its end (docs/README.md#the-access-log).
    cut: bool = False

    def run(self, serving: Coroutine[Any, Any, None]) -> Deferred[None]:
        """Run the route's server: the job's scope, which :meth:`cancel` cancels."""
        self.deferred = Deferred.fromCoroutine(serving)
        return self.deferred

    def cancelled(self) -> bool:
        """Whether the request itself was cancelled (the parent scope)."""
        return self.ending is not None

    def cancel(self, ending: Ending) -> None:
        """Cancel the whole request (the parent scope); the first reason sticks."""
        if self.ending is None:
            self.ending = ending
        if self.deferred is not None:
            self.deferred.cancel()

    def requester_gone(self, _: Failure) -> None:
        """The client left before its answer was finished."""
        self.cancel(Ending.REQUESTER_GONE)

    def refuse(
        self,
        reason: Reason,
        *,
        retry_after: int | None = None,
        message: str | None = None,
        cors: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        """Answer with a proxy-generated error and remember why, for the terminal event.

        :param message: the answer's text, when it says more than the reason's own.
        :param cors: browser permission headers the answer carries.
        """
        self.refused = reason
        write_error(
            self.request,
            self.admitted.engine,
            reason,
            retry_after=retry_after,
            message=message,
            cors=cors,
            extra=self.queued_field(),
        )

    def queued_field(self) -> tuple[tuple[bytes, bytes], ...]:
        """``X-Nvpair-Queued-Ms`` for an answer to a request that waited in fleet mode's queue
        (docs/fleet-scheduling.md#the-queue), else nothing."""
        if self.queued is None:
            return ()
        return ((b"X-Nvpair-Queued-Ms", b"%d" % round(self.queued * 1000)),)

    def served(self, status: int, committed_at: float | None = None) -> None:
        """The engines' answer is served with ``status``: one node's, relayed from
        ``committed_at`` (its commit, on the process clock), or the fleet's."""
        self.served_status = status
        self.committed_at = committed_at

    def reserve(self, reservations: Reservations, node: str) -> None:
        """Claim ``node`` for this job, moving the claim it holds (if any) there."""
        self.reservation = reservations.move(self.reservation, node)

    def release(self, reservations: Reservations) -> None:
        """Give back the claim this job holds, if any."""
        reservations.release(self.reservation)
        self.reservation = None


def outgoing_of(admitted: Admitted, fields: Fields) -> Outgoing:
    """What each attempt sends: the client's request with a copy of its head's end-to-end
    fields (``fields`` themselves are left as they are: the request's head stays as it was
    read).

    Where ``[access]`` is in force the caller's ``Authorization`` and ``X-Api-Key`` are the
    proxy's key, never an engine's: neither is sent on, whether or not a key was asked of this
    caller (docs/lan.md#keys)."""
    sent = strip_hop_by_hop(fields.copy(), request=True)
    if admitted.caller is not None:
        sent.drop(b"Authorization")
        sent.drop(b"X-Api-Key")
    return Outgoing(
        admitted.route,
        admitted.method,
        admitted.uri,
        sent,
        admitted.body,
        resend=_inference(admitted),
    )


def _inference(admitted: Admitted) -> bool:
    """An inference request, also when a peer forwards it: sending it twice costs what the
    failover loop's next dispatch would (docs/robustness.md#engine-answers)."""
    route = admitted.route
    if route is RouteClass.PEER:
        route = admitted.engine.classify(admitted.method, admitted.path)
    return route is RouteClass.INFERENCE


@frozen
class Services:
    """The process-wide pieces a route's server works with (one set per process)."""

    clock: IReactorTime
    control: ControlState
    bounds: Bounds
    upstream: UpstreamClient
    candidates: Candidates
    attempts: Attempts
    reservations: Reservations
    workloads: Workloads
    activity: NodeActivity
    #: This node's cluster id while it is a member: what ``X-Nvpair-Node`` names for the
    #: answers its own engine gives a peer.
    own_id: Callable[[], str | None]
    #: Broker mode's or standalone fleet mode's way of ordering rounds and judging nodes.
    scheduling: Scheduling
    #: The last workloads and their attempts, for the admin ``/status``.
    recorder: WorkloadRecorder
    #: What ``/metrics`` counts.
    counter: RequestCounter
    #: Fleet mode's queue (docs/fleet-scheduling.md#the-queue); none in broker mode.
    queue: Queueing = NO_QUEUE
