"""One admitted request's life (:class:`Job`) and what every route's server works with.

A job is the request's cancellation scope: the requester leaving, a client that stopped
reading, or shutdown each cancel it with an :class:`Ending`, and outcome classification reads
that reason rather than inferring it from an exception (an attempt's own cancellation must
never look like the requester leaving). :class:`Services` is the set of process-wide pieces
the servers in :mod:`nvpair.failover`, :mod:`nvpair.forwarding` and :mod:`nvpair.fleetwide`
share.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from attrs import define, frozen
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.web.http_headers import Headers

from nvpair.activity import NodeActivity
from nvpair.attempt import Attempts, Outgoing
from nvpair.budget import RetryBudget
from nvpair.candidates import Candidates
from nvpair.config import Config
from nvpair.control import ControlState
from nvpair.engines import RouteClass
from nvpair.headers import SPENT, end_to_end
from nvpair.http_facade import Admitted
from nvpair.inferstats import Stats
from nvpair.metrics import Metrics
from nvpair.proxy_answers import write_error
from nvpair.reasons import Reason
from nvpair.recent import RecentWorkloads, Trail
from nvpair.reservations import Reservation, Reservations
from nvpair.scheduling import FleetScheduler
from nvpair.web import ProxiedRequest, UpstreamClient
from nvpair.workload import Workload, Workloads


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
    #: Where this workload's attempts are recorded for the admin ``/status``; None when no
    #: admin listener runs (or the route has no workload).
    trail: Trail | None = None
    #: When the answer served began (the commit), on the process clock.
    committed_at: float | None = None
    #: The node last dispatched to: the one whose answer (or failure) the client got.
    node: str | None = None
    #: Dispatches made, on any route.
    dispatches: int = 0

    def cancelled(self) -> bool:
        """Whether the request itself was cancelled (the parent scope)."""
        return self.ending is not None

    def cancel(self, ending: Ending) -> None:
        """Cancel the whole request (the parent scope); the first reason sticks."""
        if self.ending is None:
            self.ending = ending
        if self.deferred is not None:
            self.deferred.cancel()

    def refuse(
        self, reason: Reason, *, retry_after: int | None = None, message: str | None = None
    ) -> None:
        """Answer with a proxy-generated error and remember why, for the terminal event.

        :param message: the answer's text, when it says more than the reason's own.
        """
        self.refused = reason
        write_error(
            self.request, self.admitted.engine, reason, retry_after=retry_after, message=message
        )

    def outgoing(self) -> Outgoing:
        """What each attempt sends: the client's request with its end-to-end headers.

        The last read of the client's headers: the request keeps none from then on, the
        attempts send this copy (docs/performance.md#held-streams). Where ``[access]`` is in
        force the caller's ``Authorization`` is the proxy's key, never an engine's: it is not
        sent on (docs/lan.md#keys)."""
        admitted = self.admitted
        headers = Headers()
        request = self.request
        for name, values in end_to_end(request.requestHeaders.getAllRawHeaders(), request=True):
            headers.setRawHeaders(name, values)
        if admitted.caller is not None:
            headers.removeHeader(b"authorization")
        request.requestHeaders = SPENT
        return Outgoing(
            admitted.engine.id,
            admitted.route,
            admitted.method,
            admitted.uri,
            headers,
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
    config: Config
    upstream: UpstreamClient
    candidates: Candidates
    attempts: Attempts
    reservations: Reservations
    workloads: Workloads
    activity: NodeActivity
    #: This node's cluster id while it is a member: what ``X-Nvpair-Node`` names for the
    #: answers its own engine gives a peer.
    own_id: Callable[[], str | None]
    #: Standalone fleet mode's scheduling (load states, passive health); None in broker mode.
    fleet: FleetScheduler | None = None
    #: The last workloads and their attempts, for the admin ``/status``; None (nothing
    #: recorded, nothing spent) when no admin listener runs.
    recent: RecentWorkloads | None = None
    #: What ``/metrics`` counts; None (nothing counted, nothing spent) without an admin
    #: listener.
    metrics: Metrics | None = None
