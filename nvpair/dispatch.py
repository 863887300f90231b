"""The request path after admission: the failover loop, the answer, the relay (spec §5, §6).

For an inference request: resolve owners from the live snapshot every round, reserve the
least-loaded listed candidate, fail over through the round on a retryable status or transport
error, back off between rounds, and stop at the dispatch budget or the job deadline — both
checked before every dispatch, neither truncating one in flight. Commit is the first body byte.
Other routes are resolved once and each candidate tried at most once.
"""

from __future__ import annotations

import contextlib
import enum
import math
from collections.abc import Callable
from typing import Any

from attrs import define
from twisted.internet import task
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from nvpair.activity import NodeActivity
from nvpair.answers import write_error
from nvpair.attempt import Attempts, Dispatch, Failed, Fault, Served
from nvpair.config import Config
from nvpair.control import ControlState, Discovery, Node, Priority
from nvpair.cors import Reply, inventory_grant, preflight
from nvpair.engines import RouteClass
from nvpair.facade import Admitted, RequestHandler, upstream_headers
from nvpair.fanout import Answer, ask_all
from nvpair.headers import end_to_end, framed_by_length
from nvpair.inferstats import Stats, StatsReader
from nvpair.inventory import InvalidInventory, merge_inventories
from nvpair.logs import debug_enabled
from nvpair.relay import BodyRelay, WriteDeadline
from nvpair.reservations import Reservation, Reservations
from nvpair.routing import Plan, order, owners, plan
from nvpair.upstream import Upstream
from nvpair.workload import State, Workload, Workloads

#: Caller credentials never sent along with a preflight (contract "Browser policy").
_CREDENTIALS = (b"cookie", b"authorization", b"proxy-authorization", b"x-api-key")

#: Backoff between rounds doubles each round up to this multiple of ``--retry-backoff``.
BACKOFF_CAP = 8


class Ending(enum.Enum):
    """Why a request stopped early; read by outcome classification, never inferred from an
    exception (an attempt's own cancellation must not look like the requester leaving)."""

    REQUESTER_GONE = "requester-gone"
    CLIENT_WRITE_TIMEOUT = "client-write-timeout"
    SHUTDOWN = "shutdown"


@define(eq=False)
class Job:
    """One request's life: its scope (cancellation reason) and its budget."""

    admitted: Admitted
    request: Any
    created: float
    ending: Ending | None = None
    attempts: int = 0
    reservation: Reservation | None = None
    deferred: Deferred[None] | None = None
    workload: Workload | None = None
    #: The status of the response served as the answer (the commit), if one was.
    served_status: int | None = None
    #: The reason of the proxy-generated answer, if the proxy answered.
    refused: str | None = None
    stats: Stats | None = None

    def cancelled(self) -> bool:
        """Whether the request itself was cancelled (the parent scope)."""
        return self.ending is not None

    def cancel(self, ending: Ending) -> None:
        """Cancel the whole request (the parent scope); the first reason sticks."""
        if self.ending is None:
            self.ending = ending
        if self.deferred is not None:
            self.deferred.cancel()


class NoAddress(LookupError):
    """The node has no address to dial (a local node before ``node/set-local-backend``)."""


class RequestPath(RequestHandler):
    """Serves admitted requests for every facade (one per process).

    :param clock: timeouts, backoff and the job deadline.
    :param control: the live control state, read per round.
    :param reservations: the process-wide reservation map.
    """

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        control: ControlState,
        upstream: Upstream,
        config: Config,
        reservations: Reservations,
        workloads: Workloads,
        activity: NodeActivity,
        own_id: Callable[[], str | None] = lambda: None,
    ) -> None:
        """:param own_id: this node's cluster id, if it is a member (``X-Nvpair-Node`` of
        the answers its local engine gives)."""
        self._own_id = own_id
        self._clock = clock
        self._control = control
        self._config = config
        self._reservations = reservations
        self._workloads = workloads
        self._activity = activity
        self._upstream = upstream
        self._attempts = Attempts(
            clock, control, upstream, config.response_header_timeout, self.base_url
        )
        self._jobs: set[Job] = set()

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet ended."""
        return len(self._jobs)

    def cancel_all(self) -> None:
        """Process shutdown: cancel everything in flight (each ends as cancelled)."""
        for job in list(self._jobs):
            job.cancel(Ending.SHUTDOWN)

    def base_url(self, engine: str, node: Node) -> str:
        url = self._control.local_backend(engine) if node.local else node.url
        if not url:
            raise NoAddress(f"node {node.id} has no address")
        return url

    # -- entry -----------------------------------------------------------------------------

    def handle(self, admitted: Admitted, request: Any) -> Deferred[None]:
        job = Job(admitted, request, self._clock.seconds())
        if admitted.route is RouteClass.INFERENCE:
            coroutine = self._serve_inference(job)
        elif admitted.route is RouteClass.INVENTORY:
            coroutine = self._serve_inventory(job)
        elif admitted.route is RouteClass.PREFLIGHT:
            coroutine = self._serve_preflight(job)
        elif admitted.route is RouteClass.PEER:
            coroutine = self._serve_peer(job)
        else:
            coroutine = self._serve_once_each(job)
        d = Deferred.fromCoroutine(coroutine)
        job.deferred = d
        self._jobs.add(job)
        # The requester leaving ends the loop at once: whatever the request is waiting on is
        # cancelled, and the cleanup below closes the upstream.
        request.notifyFinish().addErrback(lambda _: job.cancel(Ending.REQUESTER_GONE))

        def ended(result: object) -> object:
            # Every exit path runs this: a normal end, the requester leaving, shutdown, a node
            # dying mid-copy, a bug. Exactly one terminal event per admitted request.
            self._jobs.discard(job)
            self._reservations.release(job.reservation)
            job.reservation = None
            if job.workload is not None:
                state, error = self._terminal(job, result)
                job.workload.terminal(state, error, job.stats)
            return result

        def cancelled(failure: Failure) -> None:
            failure.trap(CancelledError)
            # Shutdown or a stuck client: whoever is still connected sees the connection close
            # rather than wait on an answer that will never come.
            if not request.finished and request.channel is not None:
                request.loseConnection()

        d.addBoth(ended)
        d.addErrback(cancelled)
        return d

    @staticmethod
    def _terminal(job: Job, result: object) -> tuple[State, str | None]:
        """The workload's terminal state (spec §5.4's outcome table)."""
        if job.ending is not None:
            # The requester left, stopped reading, or we shut down: never a node failure.
            return State.CANCELLED, job.ending.value
        if isinstance(result, Failure):
            return State.FAILED, "internal"
        if job.served_status is not None:
            if 200 <= job.served_status < 300:
                # A stream truncated by its node dying still completed: it started, and the
                # proxy cannot tell truncated from whole (spec §1.1).
                return State.COMPLETED, None
            return State.FAILED, f"upstream status {job.served_status}"
        return State.FAILED, job.refused or "internal"

    def _refuse(self, job: Job, reason: str, retry_after: float | None = None) -> None:
        """Answer with a proxy-generated error and remember why, for the terminal event."""
        job.refused = reason
        write_error(
            job.request,
            job.admitted.engine,
            reason,
            retry_after=None if retry_after is None else self._retry_after(retry_after),
        )

    # -- candidates ------------------------------------------------------------------------

    def _plan(self, admitted: Admitted) -> Plan:
        """This round's candidates from the live snapshot (never a memory of past nodes)."""
        engine = admitted.engine.id
        discovery = self._control.discovery(engine)
        if admitted.route is RouteClass.INFERENCE:
            eligible = owners(discovery, admitted.model_key)
        else:
            # Other routes go to the named model's owners when any node has it, else to any
            # node of the engine (contract, "Inference vs other routes").
            named = owners(discovery, admitted.model_key) if admitted.model_key else []
            eligible = named or list(discovery.nodes)
        # A node with nothing to dial (a local node before its backend is known) is no
        # candidate: trying it would cost an attempt and report a dispatch that never left.
        dialable = [node for node in eligible if self._dialable(engine, node)]
        priority: Priority = self._control.priority
        return plan(dialable, self._control.pin(engine), priority, self._reservations.counts)

    def _dialable(self, engine: str, node: Node) -> bool:
        return not node.local or self._control.local_backend(engine) is not None

    def _live(self, admitted: Admitted, node: Node) -> Node | None:
        """``node`` as the live snapshot has it now, if it is still one of the owners.

        A round is planned once; a node that left discovery (or stopped advertising the
        model) since is skipped at no attempt's cost, and one whose URL changed is dialled
        where it is now.
        """
        engine = admitted.engine.id
        live = self._control.discovery(engine).node(node.id)
        if live is None or not self._dialable(engine, live):
            return None
        return live if owners(Discovery((live,)), admitted.model_key) else None

    def _dispatch(self, job: Job) -> Dispatch:
        admitted = job.admitted
        headers = Headers()
        for name, values in upstream_headers(job.request):
            headers.setRawHeaders(name, values)
        return Dispatch(
            admitted.engine.id,
            admitted.route,
            admitted.method,
            admitted.uri,
            headers,
            admitted.body,
        )

    # -- inference: the failover loop ------------------------------------------------------

    async def _serve_inference(self, job: Job) -> None:
        config = self._config
        engine = job.admitted.engine
        deadline = job.created + config.job_deadline
        backoff = config.retry_backoff
        dispatch = self._dispatch(job)
        request = job.request

        round_plan = self._plan(job.admitted)
        if not round_plan.candidates:
            # No owner at admission: a model nobody advertises will not become servable by
            # waiting, and nothing has been dispatched. Never admitted: no workload events.
            write_error(request, engine, "no-owner")
            return
        model = job.admitted.model
        workload = self._workloads.admit(engine.id, engine.model_display(model) if model else "")
        job.workload = workload

        while True:
            if not round_plan.candidates:
                # An owner existed within this request's life and went away: wait for one,
                # at no attempt's cost, until the deadline.
                remaining = deadline - self._clock.seconds()
                if remaining <= 0:
                    self._refuse(job, "no-owner-timeout", backoff)
                    return
                # Re-resolved on the backoff schedule, and at once when discovery changes
                # (with --retry-backoff 0 only then: never a busy loop).
                await self._owner_change(engine.id, min(backoff, remaining) or remaining)
                backoff = min(backoff * 2, config.retry_backoff * BACKOFF_CAP)
                round_plan = self._plan(job.admitted)
                continue

            # The plan names a node to reserve unless an eligible pin applies; the claim then
            # follows each dispatch (the node that refused is not doing the work).
            reserving = round_plan.reserve is not None
            dispatched = False
            for planned in round_plan.candidates:
                node = self._live(job.admitted, planned)
                if node is None:
                    continue
                # Both bounds are checked before every dispatch, never during one.
                if job.attempts >= config.max_dispatch_attempts:
                    self._refuse(job, "attempts-exhausted", backoff)
                    return
                if self._clock.seconds() >= deadline:
                    self._refuse(job, "deadline", backoff)
                    return
                job.attempts += 1
                final = job.attempts == config.max_dispatch_attempts
                if reserving:
                    job.reservation = self._reservations.move(job.reservation, node.id)
                workload.submitted(node.id)
                dispatched = True
                failed = await self._try(job, dispatch, node, final)
                if failed is None:
                    return
                if final:
                    self._answer_final(job, failed)
                    return
                # Between attempts the job is placed nowhere.
                workload.submitted(None)

            if not dispatched:
                # Every planned node left before its turn: plan again from the live snapshot
                # (no backoff: nothing failed).
                round_plan = self._plan(job.admitted)
                continue

            # The round is exhausted: nothing runs between attempts, so the claim goes now
            # (a stale one would push the other engines' traffic off a free node).
            self._reservations.release(job.reservation)
            job.reservation = None
            remaining = deadline - self._clock.seconds()
            if remaining <= 0:
                self._refuse(job, "deadline", backoff)
                return
            await self._sleep(min(backoff, remaining))
            backoff = min(backoff * 2, config.retry_backoff * BACKOFF_CAP)
            round_plan = self._plan(job.admitted)

    def _answer_final(self, job: Job, failed: Failed) -> None:
        """The final permitted attempt answers for itself (spec §5.4)."""
        timed_out = failed.why is Fault.FIRST_BODY_TIMEOUT
        self._refuse(job, "first-body-timeout" if timed_out else "upstream-transport")

    # -- other routes: each candidate at most once ------------------------------------------

    async def _serve_once_each(self, job: Job) -> None:
        engine = job.admitted.engine
        candidates = self._plan(job.admitted).candidates
        if not candidates:
            write_error(job.request, engine, "no-owner")
            return
        dispatch = self._dispatch(job)
        for index, node in enumerate(candidates):
            final = index == len(candidates) - 1
            failed = await self._try(job, dispatch, node, final)
            if failed is None:
                return
            if final:
                self._answer_final(job, failed)

    # -- cluster peers ---------------------------------------------------------------------

    async def _serve_peer(self, job: Job) -> None:
        """A pinned peer's request: the local engine answers it, never another node.

        The peer that sent it already chose this node and runs its own failover; re-routing
        here could bounce a request around the cluster.
        """
        local = Node(id="local", local=True, url=None, models=(), model_keys=frozenset())
        failed = await self._try(job, self._dispatch(job), local, True)
        if failed is not None:
            self._answer_final(job, failed)

    # -- fan-out: inventories and preflights -----------------------------------------------

    async def _ask_every_node(
        self, job: Job, method: bytes, path: str, headers: Headers
    ) -> list[Answer]:
        """Every node of the engine, concurrently, in candidate order; responders only.

        No reservations and no workload events: nothing is dispatched for inference.
        """
        engine = job.admitted.engine.id
        control = self._control
        nodes = order(control.discovery(engine).nodes, control.pin(engine), control.priority)
        query = job.admitted.uri[len(job.admitted.path.encode("latin-1")) :]
        bases = [self._maybe_base_url(engine, node) for node in nodes]
        answers = await ask_all(
            self._upstream,
            self._clock,
            self._config.dial_timeout,
            bases,
            method,
            path.encode("latin-1") + query,
            headers,
        )
        if job.cancelled():
            raise CancelledError()
        return [answer for answer in answers if answer is not None]

    def _maybe_base_url(self, engine: str, node: Node) -> str | None:
        try:
            return self.base_url(engine, node)
        except NoAddress:
            return None

    async def _serve_inventory(self, job: Job) -> None:
        """The fleet's model list: every node asked, merged (contract "Fleet inventories")."""
        admitted = job.admitted
        engine = admitted.engine
        request = job.request
        route = engine.inventory[admitted.path]
        origin = request.requestHeaders.getRawHeaders(b"origin", [None])[0]
        # A HEAD is decided like a GET (validity needs the bodies) and answered without one.
        answers = await self._ask_every_node(
            job, b"GET", route.upstream_path or admitted.path, self._dispatch(job).headers
        )
        if not answers:
            self._refuse(job, "no-responders")
            return
        replies = [Reply(a.status, a.headers) for a in answers]
        grant = inventory_grant(origin, replies) if origin is not None else None
        # With an Origin, only granting responders are judged for validity; a denial is a
        # denial, not an invalid list.
        judged = [
            a
            for a, r in zip(answers, replies, strict=True)
            if origin is None or inventory_grant(origin, [r]).granted
        ]
        merged = b""
        invalid = any(not 200 <= a.status < 300 for a in judged)
        if not invalid:
            try:
                merged = merge_inventories(engine, admitted.path, [a.body for a in judged])
            except InvalidInventory:
                invalid = True
        if invalid:
            # No partial list. CORS headers only when every responder granted.
            cors = grant.headers if grant is not None and grant.granted else ()
            job.refused = "inventory-invalid"
            write_error(request, engine, "inventory-invalid", cors=cors)
            return
        if grant is not None and not grant.granted:
            self._refuse(job, "cors-denied")
            return
        request.setResponseCode(200)
        request.responseHeaders.setRawHeaders(b"content-type", [b"application/json; charset=utf-8"])
        request.responseHeaders.setRawHeaders(b"content-length", [b"%d" % len(merged)])
        for name, value in grant.headers if grant is not None else ():
            request.responseHeaders.addRawHeader(name, value)
        if admitted.method != b"HEAD":
            request.write(merged)
        request.finish()

    async def _serve_preflight(self, job: Job) -> None:
        """A CORS preflight: every node asked without credentials, permissions intersected."""
        request = job.request
        headers = self._dispatch(job).headers
        for name in _CREDENTIALS:
            headers.removeHeader(name)
        answers = await self._ask_every_node(job, b"OPTIONS", job.admitted.path, headers)
        if not answers:
            self._refuse(job, "no-responders")
            return
        origin = request.requestHeaders.getRawHeaders(b"origin")[0]
        decision = preflight(origin, [Reply(a.status, a.headers) for a in answers])
        # A denial passes through as a denial: the engine's status, nothing else. It is not
        # proxy-generated, so it carries no X-Nvpair-Error.
        request.setResponseCode(decision.status)
        request.responseHeaders.setRawHeaders(b"content-length", [b"0"])
        for name, value in decision.headers:
            request.responseHeaders.addRawHeader(name, value)
        request.finish()

    # -- shared ----------------------------------------------------------------------------

    async def _try(self, job: Job, dispatch: Dispatch, node: Node, final: bool) -> Failed | None:
        """One dispatch to ``node``: serve its answer (None), or say why it failed."""
        # A peer's request targets this node's own engine, which is no discovery node: it is
        # the sending node that reports activity toward us.
        tracking = (
            contextlib.nullcontext()
            if dispatch.route is RouteClass.PEER
            else self._activity.tracking(job.admitted.engine.id, node.id)
        )
        with tracking:
            outcome = await self._attempts.run(dispatch, node, final, job.cancelled)
            if isinstance(outcome, Served):
                await self._deliver(job, node, outcome)
                return None
        self._failed(job, node, outcome)
        return outcome

    def _failed(self, job: Job, node: Node, failed: Failed) -> None:
        if not debug_enabled():
            return
        self.log.debug(
            "attempt {attempt} to {node} failed: {why} {status} {detail}",
            engine=job.admitted.engine.id,
            attempt=job.attempts,
            node=node.id,
            why=failed.why.value,
            status=failed.status,
            detail=failed.detail,
        )

    async def _deliver(self, job: Job, node: Node, served: Served) -> None:
        """Write the served response's status and headers, then relay its body."""
        request = job.request
        response = served.response
        request.setResponseCode(response.code, response.phrase)
        headers = request.responseHeaders
        for name, values in end_to_end(response.headers.getAllRawHeaders(), request=False):
            headers.setRawHeaders(name, values)
        if framed_by_length(job.admitted.method, response.code) and isinstance(
            response.length, int
        ):
            # Twisted's client moves Content-Length out of the headers into ``length``;
            # putting it back keeps the engine's framing (else the client gets chunked).
            headers.setRawHeaders(b"content-length", [b"%d" % response.length])
        headers.setRawHeaders(b"x-nvpair-node", [self._answering_node(node).encode()])
        relay: BodyRelay = served.relay
        relay.set_deadline(lambda upstream: self._write_deadline(job, upstream))
        job.served_status = response.code
        reader: StatsReader | None = None
        if job.workload is not None:
            job.workload.started(node.id)
            if response.code < 400:
                # Only a committed answer below 400 is measured: never an error body.
                reader = StatsReader(job.created)
                clock, feed = self._clock, reader.feed
                relay.set_tap(lambda chunk: feed(chunk, clock.seconds()))
        relay.attach(request)
        try:
            end = await relay.done
        except CancelledError:
            relay.client_gone()
            raise
        finally:
            if reader is not None:
                job.stats = reader.finish(self._clock.seconds())
        if debug_enabled():
            self.log.debug(
                "{path} served by {node}: {status} complete={complete}",
                engine=job.admitted.engine.id,
                path=job.admitted.path,
                node=node.id,
                status=response.code,
                complete=end.complete,
            )

    def _answering_node(self, node: Node) -> str:
        """The id an answer names in ``X-Nvpair-Node``: for a peer's request, this node's."""
        if node.local:
            own = self._own_id()
            if own is not None:
                return own
        return node.id

    def _write_deadline(self, job: Job, upstream: IPushProducer) -> WriteDeadline:
        def expired() -> None:
            self.log.debug(
                "client accepted nothing for {seconds}s: dropped",
                engine=job.admitted.engine.id,
                seconds=self._config.client_write_timeout,
            )
            job.cancel(Ending.CLIENT_WRITE_TIMEOUT)
            channel = job.request.channel
            if channel is not None and channel.transport is not None:
                channel.transport.abortConnection()

        return WriteDeadline(upstream, self._clock, self._config.client_write_timeout, expired)

    def _owner_change(self, engine: str, seconds: float) -> Deferred[None]:
        """Fires after ``seconds``, or as soon as ``engine``'s discovery snapshot changes."""
        subscribed = True

        def stop() -> None:
            nonlocal subscribed
            if timer.active():
                timer.cancel()
            if subscribed:
                subscribed = False
                unsubscribe()

        def wake() -> None:
            stop()
            if not d.called:
                d.callback(None)

        def changed(changed_engine: str, snapshot: Discovery) -> None:
            if changed_engine == engine:
                wake()

        d: Deferred[None] = Deferred(lambda _: stop())
        unsubscribe = self._control.on_discovery(changed)
        timer = self._clock.callLater(max(0.0, seconds), wake)
        return d

    def _sleep(self, seconds: float) -> Deferred[None]:
        return task.deferLater(self._clock, max(0.0, seconds), lambda: None)

    def _retry_after(self, backoff: float) -> int:
        return max(1, math.ceil(backoff))
