"""The request path's entry: an admitted request becomes a job, served by its route's server.

Which server runs is a table lookup on the route class (:data:`SERVERS`). Whatever way a job
ends — served, refused, the requester leaving, shutdown, a bug — :meth:`RequestPath.handle`
runs the same cleanup: the reservation is released and exactly one terminal workload event is
emitted (docs/request-path.md#workload-lifecycle). A server records how it answered (served or
refused) on the job; one that ends without doing so is a bug, answered and counted as one.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from functools import partial
from typing import Any, NamedTuple

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure

from nvpair.common.reasons import Reason
from nvpair.control.keyscope import KeyScope
from nvpair.control.reservations import Reservations
from nvpair.control.state import ControlState
from nvpair.dispatch.activity import NodeActivity
from nvpair.dispatch.attempt import Attempts
from nvpair.dispatch.budget import Bounds
from nvpair.dispatch.candidates import Candidates
from nvpair.dispatch.failover import serve_inference
from nvpair.dispatch.fleetwide import serve_inventory, serve_preflight
from nvpair.dispatch.forwarding import serve_once_each, serve_peer
from nvpair.dispatch.job import Ending, Job, Services, outgoing_of
from nvpair.dispatch.queueing import NO_QUEUE, Queueing
from nvpair.dispatch.seams import (
    NOT_COUNTED,
    NOT_RECORDED,
    RequestCounter,
    Scheduling,
    WorkloadRecorder,
)
from nvpair.dispatch.workload import State, Workloads
from nvpair.engines.table import RouteClass
from nvpair.facades.access import (
    FAN_OUT,
    AccessLog,
    Finished,
    bounded_path,
    millis,
    shown_address,
)
from nvpair.facades.answers import forbidden_model_message
from nvpair.facades.facade import Admitted, RequestHandler
from nvpair.wire.message import End, Ended
from nvpair.wire.web import ProxiedRequest, UpstreamClient

Server = Callable[[Services, Job], Coroutine[Any, Any, None]]

#: Each route class's server (docs/request-path.md#route-classes).
SERVERS: dict[RouteClass, Server] = {
    RouteClass.INFERENCE: serve_inference,
    RouteClass.INVENTORY: serve_inventory,
    RouteClass.PREFLIGHT: serve_preflight,
    RouteClass.OTHER: serve_once_each,
    RouteClass.PEER: serve_peer,
}


class RequestPath(RequestHandler):
    """Serves admitted requests for every facade (one per process).

    :param clock: timeouts, backoff and the job deadline.
    :param control: the live control state, read per round.
    :param bounds: what bounds each request's effort.
    :param reservations: the process-wide reservation map.
    :param scheduling: broker mode's or standalone fleet mode's (:mod:`nvpair.dispatch.seams`).
    :param own_id: this node's cluster id, if it is a member (``X-Nvpair-Node`` of the
        answers its local engine gives).
    :param recorder: where admitted workloads and their attempts are recorded for the admin
        ``/status``; nowhere when no admin listener runs.
    :param counter: what ``/metrics`` counts; nothing when no admin listener runs.
    :param servers: each route class's server (:data:`SERVERS`).
    :param access: the access log; None when it is off.
    :param queue: fleet mode's queue (docs/fleet-scheduling.md#the-queue); none in broker mode.
    """

    def __init__(
        self,
        clock: IReactorTime,
        control: ControlState,
        upstream: UpstreamClient,
        bounds: Bounds,
        reservations: Reservations,
        workloads: Workloads,
        activity: NodeActivity,
        scheduling: Scheduling,
        own_id: Callable[[], str | None] = lambda: None,
        recorder: WorkloadRecorder = NOT_RECORDED,
        counter: RequestCounter = NOT_COUNTED,
        servers: Mapping[RouteClass, Server] = SERVERS,
        access: AccessLog | None = None,
        queue: Queueing = NO_QUEUE,
    ) -> None:
        self._servers = servers
        candidates = Candidates(control, reservations, scheduling)
        self._services = Services(
            clock=clock,
            control=control,
            bounds=bounds,
            upstream=upstream,
            candidates=candidates,
            attempts=Attempts(
                clock, control, upstream, bounds.response_header_timeout, candidates.base_url
            ),
            reservations=reservations,
            workloads=workloads,
            activity=activity,
            own_id=own_id,
            scheduling=scheduling,
            recorder=recorder,
            counter=counter,
            queue=queue,
        )
        self._jobs: set[Job] = set()
        self._access = access

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet ended."""
        return len(self._jobs)

    def cancel_all(self) -> None:
        """Process shutdown: cancel everything in flight (each ends as cancelled)."""
        for job in list(self._jobs):
            job.cancel(Ending.SHUTDOWN)
        self._services.queue.stop()

    def handle(self, admitted: Admitted, request: ProxiedRequest) -> Deferred[None]:
        services = self._services
        now = services.clock.seconds()
        admitted = services.candidates.resolved(admitted)
        job = Job(
            admitted,
            request,
            outgoing_of(admitted, request.head.fields),
            now,
            services.bounds.budget(now),
        )
        server = self._servers[admitted.route]
        if admitted.caller is not None:
            refused = key_refusal(admitted, services.control)
            if refused is not None:
                server = partial(serve_key_refusal, refused)
        d = job.run(server(services, job))
        self._jobs.add(job)
        # The requester leaving ends the job at once: whatever it is waiting on is cancelled,
        # and the cleanup below closes the upstream.
        request.on_lost(job.requester_gone)
        # Bound methods and module functions, not closures: one job of each is held for every
        # stream in flight (docs/performance.md#held-streams).
        d.addBoth(self._ended, job)
        d.addErrback(_cancelled, request)
        return d

    def _ended(self, result: object, job: Job) -> object:
        # Every exit path runs this. Exactly one terminal event per admitted request.
        services = self._services
        if not isinstance(result, Failure) and not _accounted(job):
            # Nothing answered and nothing said why: the client would wait for ever. A bug,
            # answered 500 as any other (the facade does it) and counted as one.
            result = Failure(Unanswered(f"the {job.admitted.route.value} server ended unanswered"))
        self._jobs.discard(job)
        job.release(services.reservations)
        if job.workload is not None:
            state, error = terminal(job, result)
            job.workload.terminal(state, error, job.stats)
        counted(services.counter, job, services.clock.seconds())
        if self._access is not None:
            self._access.write(finished(job, services.clock.seconds()))
        return result


class KeyRefusal(NamedTuple):
    """Why a key may not make a request: the reason, and the model it may not use."""

    reason: Reason
    model: str | None = None


def key_refusal(admitted: Admitted, control: ControlState) -> KeyRefusal | None:
    """Why the caller's key may not make this request, if it may not
    (docs/lan.md#what-a-key-can-and-cannot-do): a route that changes what an engine holds
    without ``manage``; a model the key's patterns do not allow, judged on what each name
    resolves to in the fleet now (a pattern alias's models for one it took), among every
    model the request names. An inference request
    that names none is refused too: which model it gets would be the engine's choice."""
    caller, engine, route = admitted.caller, admitted.engine, admitted.route
    assert caller is not None
    if (
        not caller.manage
        and route is RouteClass.OTHER
        and engine.manages(admitted.method, admitted.path)
    ):
        return KeyRefusal(Reason.FORBIDDEN_ROUTE)
    if not caller.models:
        return None
    if admitted.opaque and route is RouteClass.OTHER:
        # An engine's decoder may read a model where this proxy reads none (invalid UTF-8,
        # data after the object, nesting past Python's parser, a multipart form).
        return KeyRefusal(Reason.FORBIDDEN_MODEL, OPAQUE)
    scope = KeyScope(caller.models, engine, control.discovery)
    model = admitted.model
    if model is None:
        if route is RouteClass.INFERENCE:
            return KeyRefusal(Reason.FORBIDDEN_MODEL)
    elif route in _MODEL_ROUTES and not scope.allows(model, admitted.pattern):
        return KeyRefusal(Reason.FORBIDDEN_MODEL, model)
    for other in admitted.others:
        if not scope.name_allowed(engine, other):
            return KeyRefusal(Reason.FORBIDDEN_MODEL, other)
    return None


#: The routes whose model decides where the request goes; a model list is filtered instead,
#: and a preflight uses no model.
_MODEL_ROUTES = frozenset({RouteClass.INFERENCE, RouteClass.OTHER})


#: :class:`KeyRefusal`'s model for a body whose model cannot be read.
OPAQUE = "\0opaque"


async def serve_key_refusal(refused: KeyRefusal, services: Services, job: Job) -> None:
    """A key may not make this request: refused, nothing dispatched, no workload."""
    if refused.model == OPAQUE:
        job.refuse(
            refused.reason,
            message="this key may use only some models, and this body is no JSON object "
            "whose model the proxy can read",
        )
    elif refused.reason is Reason.FORBIDDEN_MODEL:
        job.refuse(refused.reason, message=forbidden_model_message(refused.model))
    else:
        job.refuse(refused.reason)


class Unanswered(RuntimeError):
    """A route's server returned without answering its request or saying why not."""


def _accounted(job: Job) -> bool:
    """Whether the job says how it ended: served, refused, or cancelled."""
    return job.served_status is not None or job.refused is not None or job.ending is not None


#: How an answer a job was cancelled in the middle of ends: cut, for its client to see.
_CUT = Ended(End.CUT)


def _cancelled(failure: Failure, request: ProxiedRequest) -> None:
    failure.trap(CancelledError)
    # Shutdown or a stuck client: whoever is still connected sees the connection close
    # rather than wait on an answer that will never come.
    if not request.finished and request.connected:
        request.end(_CUT)


def outcome(job: Job) -> str:
    """A request's outcome as ``/metrics`` labels it: ``served`` when an engine's answer was
    relayed (the fleet's merged list or intersected preflight included), else the proxy's
    reason, or ``cancelled``; ``internal`` for a bug (an exception, or a server that ended
    unanswered)."""
    if job.served_status is not None:
        return "served"
    if job.ending is not None:
        return "cancelled"
    return (job.refused or Reason.INTERNAL).value


def counted(counter: RequestCounter, job: Job, now: float) -> None:
    """One ended request, counted (docs/operations.md#metrics)."""
    admitted, committed = job.admitted, job.committed_at
    counter.request_ended(
        admitted.engine.id,
        admitted.route.value,
        outcome(job),
        job.budget.used,
        now - job.created,
        None if committed is None else committed - job.created,
        job.stats,
    )
    stats, node = job.stats, job.node
    if stats is not None and stats.cached_tokens and node is not None:
        # Per node, by the node's own engine: a facade reaching several (openai) counts the
        # engine of the node that answered (docs/operations.md#metrics).
        counter.cached_read(job.node_engine or admitted.engine.id, node, stats.cached_tokens)
    key = _key_name(admitted)
    if key is not None:
        counter.key_request_ended(key, admitted.engine.id, outcome(job))
    if job.queued is not None:
        counter.queue_waited(admitted.engine.id, job.queued)


def _key_name(admitted: Admitted) -> str | None:
    caller = admitted.caller
    return None if caller is None else caller.name


def finished(job: Job, now: float) -> Finished:
    """An admitted request's access line, when its job ends (docs/README.md#the-access-log)."""
    admitted, request = job.admitted, job.request
    committed = job.committed_at
    judged = None if job.workload is None else job.workload.affinity
    return Finished(
        engine=job.node_engine or admitted.engine.id,
        facade=admitted.engine.id,
        method=admitted.method.decode("latin-1"),
        path=bounded_path(admitted.path),
        # What was written, if anything was: a requester gone before any answer has none.
        status=request.status if request.started else None,
        route=admitted.route.value,
        # The metric's outcome stays served: its engine answered, and only the attempt and
        # this line say it was cut (docs/README.md#the-access-log).
        outcome="truncated" if job.cut else outcome(job),
        node=job.node,
        attempts=None if admitted.route in FAN_OUT else job.dispatches,
        ttfb_ms=None if committed is None else millis(committed - job.created),
        duration_ms=millis(now - job.created),
        key=_key_name(admitted),
        queued_ms=None if job.queued is None else millis(job.queued),
        client=shown_address(admitted.client),
        affinity=None if judged is None else judged.result,
        affinity_why=None if judged is None else judged.why,
    )


def terminal(job: Job, result: object) -> tuple[State, str | None]:
    """A job's terminal workload state and error (docs/request-path.md#workload-lifecycle)."""
    if job.ending is not None:
        # The requester left, stopped reading, or we shut down: never a node failure.
        return State.CANCELLED, job.ending.value
    if isinstance(result, Failure):
        return State.FAILED, Reason.INTERNAL.value
    if job.served_status is not None:
        if 200 <= job.served_status < 300:
            # A stream truncated by its node dying still completed: it started, and only its
            # attempt's result says it was cut (docs/request-path.md#workload-lifecycle).
            return State.COMPLETED, None
        return State.FAILED, f"upstream status {job.served_status}"
    return State.FAILED, (job.refused or Reason.INTERNAL).value
