"""The failover loop of an inference request (docs/request-path.md, docs/retry-budget.md).

Each round plans its candidates from the live snapshot, reserves the least-loaded listed one,
and tries them in order, moving on after a retryable status or transport failure. Before each
dispatch the node is checked against the live snapshot (a node that left costs no attempt) and
the budget is asked whether a dispatch may start. Between rounds the loop backs off; when every
owner has gone it waits for one at no attempt's cost. Commit is the first body byte, decided
by the attempt. Each attempt's outcome is told to the mode's scheduling, which may judge the
node by it, and the scheduling bounds the wait for an owner (standalone fleet mode's passive
health and ``--owner-wait``, docs/fleet-scheduling.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from twisted.internet import task
from twisted.internet.defer import Deferred

from nvpair.common.durations import format_duration
from nvpair.common.reasons import Reason
from nvpair.control.affinity import LEFT, QUEUE
from nvpair.control.fairqueue import Option
from nvpair.control.routing import Plan
from nvpair.control.state import Discovery, Node
from nvpair.dispatch.affinitynote import note_affinity
from nvpair.dispatch.attempt import Failed, Fault, Outgoing
from nvpair.dispatch.candidates import model_key_on
from nvpair.dispatch.delivery import answer_final, try_node
from nvpair.dispatch.job import Job, Services
from nvpair.dispatch.outcome import Verdict, classify
from nvpair.dispatch.queueing import FleetQueue, QueueFull
from nvpair.engines.caller import Priority
from nvpair.facades.answers import no_owner_message, no_owner_timeout_message


async def serve_inference(services: Services, job: Job) -> None:
    engine = job.admitted.engine
    candidates = services.candidates
    round_plan = candidates.plan(job.admitted)
    if not round_plan.candidates:
        # No owner at admission: a model nobody advertises will not become servable by
        # waiting, and nothing has been dispatched. Never admitted: no workload events.
        job.refuse(
            Reason.NO_OWNER, message=no_owner_message(job.admitted.model, _down(services, job))
        )
        return
    model = job.admitted.model
    # A workload's engine is that of the node it goes to: the facade's own, or for a facade
    # reaching several engines, the first candidate's until a dispatch says otherwise.
    job.workload = services.workloads.admit(
        round_plan.candidates[0].engine,
        engine.model_display(model) if model else "",
        caller=job.admitted.caller,
        facade=engine.id,
    )
    job.trail = services.recorder.admitted(job.workload)
    outgoing = job.outgoing
    if services.queue.enabled:
        await _serve_queued(services, job, outgoing, round_plan)
        return
    while True:
        if not round_plan.candidates:
            # An owner existed within this request's life and went away: wait for one, at
            # no attempt's cost, until the deadline (in fleet mode, at most --owner-wait).
            if not await _owner_back(services, job):
                return
            round_plan = candidates.plan(job.admitted)
            continue

        job.budget = job.budget.owners_back()
        dispatched = await _round(services, job, round_plan, outgoing)
        if dispatched is None:
            return
        if not dispatched:
            # Every planned node left before its turn: plan again from the live snapshot
            # (no backoff: nothing failed).
            round_plan = candidates.plan(job.admitted)
            continue
        if not await _round_over(services, job):
            return
        round_plan = candidates.plan(job.admitted)


async def _owner_back(services: Services, job: Job) -> bool:
    """Wait, at no attempt's cost, for an owner to come back; False when the wait ran out and
    the request was answered 503 ``no-owner-timeout``."""
    clock = services.clock
    job.budget = job.budget.owners_gone(clock.seconds(), services.scheduling.owner_wait)
    wait = job.budget.owner_wait(clock.seconds())
    if wait is None:
        job.refuse(
            Reason.NO_OWNER_TIMEOUT,
            retry_after=job.budget.retry_after(),
            message=no_owner_timeout_message(job.admitted.model, _bound(services, job)),
        )
        return False
    await _owner_change(services, job.admitted.engine.serves, wait)
    job.budget = job.budget.backed_off()
    return True


async def _round_over(services: Services, job: Job) -> bool:
    """A round is exhausted: its claim goes (nothing runs between attempts, and a stale one
    would push other traffic off a free node), then the backoff; False when the deadline
    came first and the request was answered 503 ``deadline``."""
    clock = services.clock
    job.release(services.reservations)
    pause = job.budget.pause(clock.seconds())
    if pause is None:
        job.refuse(Reason.DEADLINE, retry_after=job.budget.retry_after())
        return False
    await task.deferLater(clock, pause, lambda: None)
    job.budget = job.budget.backed_off()
    return True


async def _round(services: Services, job: Job, round_plan: Plan, outgoing: Outgoing) -> bool | None:
    """Try the round's candidates in order.

    :return: None when the request has been answered (served or refused); else whether
        anything was dispatched this round.
    """
    workload = job.workload
    assert workload is not None
    # The plan names a node to reserve unless an eligible pin applies; the claim then
    # follows each dispatch (the node that refused is not doing the work).
    reserving = round_plan.reserve is not None
    dispatched = False
    for planned in round_plan.candidates:
        node = services.candidates.live(job.admitted, planned)
        if node is None:
            continue
        # Both bounds are checked before every dispatch, never during one.
        refusal = job.budget.refusal(services.clock.seconds())
        if refusal is not None:
            job.refuse(refusal, retry_after=job.budget.retry_after())
            return None
        job.budget = job.budget.spend()
        if reserving:
            job.reserve(services.reservations, node.id)
        workload.engine = node.engine
        workload.submitted(node.id)
        dispatched = True
        # Affinity's node is the first behind any pin: an id alone could name a node of another
        # engine in a round over several (the openai facade).
        affine = (
            round_plan.affine is not None
            and planned is round_plan.candidates[int(round_plan.pinned)]
        )
        # The first candidate that is still there: the ones before it left.
        note_affinity(services, job, round_plan, node, LEFT)
        failed = await _attempt(services, job, outgoing, node, affine)
        if failed is None:
            return None
        if job.budget.final:
            answer_final(job, failed)
            return None
        # Between attempts the job is placed nowhere.
        workload.submitted(None)
    return dispatched


async def _serve_queued(services: Services, job: Job, outgoing: Outgoing, round_plan: Plan) -> None:
    """The failover loop with fleet mode's queue (docs/fleet-scheduling.md#the-queue): each
    dispatch waits for a place the queue gives it on one of the round's owners not yet tried —
    the first that frees, by the fleet order, in the caller's turn. A failed attempt comes back
    with its place in the turns; a round ends when every owner has been tried."""
    queue = services.queue
    assert isinstance(queue, FleetQueue)
    candidates, clock, admitted = services.candidates, services.clock, job.admitted
    caller, engine = admitted.caller, admitted.engine
    waiter = queue.waiter(
        _caller_id(job),
        caller.priority if caller is not None else Priority.NORMAL,
        (admitted.engine.id, admitted.model_key),
        engine.model_display(admitted.model) if admitted.model else "",
    )
    deadline = job.created + services.bounds.job_deadline
    tried: set[tuple[str, str]] = set()
    nodes: dict[tuple[str, str], Node] = {}

    planned: list[Plan] = []
    # The plan made just before a take, in the same turn: the take's first ask reads it rather
    # than make the same order again (a fleet plan is most of a queued request's own cost).
    fresh: list[Plan] = []

    def options() -> list[Option]:
        """The round's owners not yet tried, as the live snapshot has them now (the plan they
        came from is kept: the one a place was given from)."""
        nodes.clear()
        found = []
        plan = fresh.pop() if fresh else candidates.plan(admitted)
        planned[:] = [plan]
        for node in plan.candidates:
            key = (node.engine, node.id)
            if key not in tried:
                nodes[key] = node
                model = node.own_key(model_key_on(node.engine, admitted))
                found.append(queue.option(key, model, node.model_keys))
        return found

    while True:
        if not round_plan.candidates:
            if not await _owner_back(services, job):
                return
            round_plan = candidates.plan(admitted)
            continue
        job.budget = job.budget.owners_back()
        if all((node.engine, node.id) in tried for node in round_plan.candidates):
            # Every owner has been tried: the round is over, as without the queue.
            if not await _round_over(services, job):
                return
            tried.clear()
            round_plan = candidates.plan(admitted)
            continue
        try:
            # max-wait bounds the time spent waiting, every wait of the request together.
            until = min(deadline, clock.seconds() + queue.options.max_wait - waiter.waited)
            # Waiters of one model, caller and tried owners have the same places to go.
            alike = (waiter.group, waiter.caller, frozenset(tried))
            fresh[:] = [round_plan]
            try:
                taking = queue.take(waiter, options, until, alike=alike)
            finally:
                # Read by the take's own pump, or by nobody: a later pump plans anew.
                fresh.clear()
            place = await taking
        except QueueFull:
            job.refuse(Reason.QUEUE_FULL, retry_after=_queue_retry(queue))
            return
        finally:
            job.queued = waiter.waited or None
            assert job.workload is not None
            job.workload.queued_ms = None if job.queued is None else round(job.queued * 1000)
        if place is None:
            job.refuse(Reason.QUEUE_TIMEOUT, retry_after=_queue_retry(queue))
            return
        try:
            node = nodes.get(place.node)
            live = None if node is None else candidates.live(admitted, node)
            if live is None:
                # Gone between the pump and now: no attempt spent, the round goes on.
                continue
            refusal = job.budget.refusal(clock.seconds())
            if refusal is not None:
                job.refuse(refusal, retry_after=job.budget.retry_after())
                return
            failed = await _dispatch(services, job, outgoing, live, planned[0])
        finally:
            queue.release(place)
        if failed is None:
            return
        if job.budget.final:
            answer_final(job, failed)
            return
        assert job.workload is not None
        job.workload.submitted(None)
        tried.add(place.node)
        round_plan = candidates.plan(admitted)


async def _dispatch(
    services: Services, job: Job, outgoing: Outgoing, node: Node, plan: Plan
) -> Failed | None:
    """One dispatch the queue gave a place: spent, claimed and recorded as the plain loop's.

    :param plan: the order the place was given from, before this dispatch's claim moved the
        loads: affinity's node is the first behind any pin there (an id alone could name a
        node of another engine in a round over several)."""
    workload = job.workload
    assert workload is not None
    first = plan.candidates[int(plan.pinned)] if len(plan.candidates) > plan.pinned else None
    affine = (
        plan.affine is not None
        and first is not None
        and (first.engine, first.id) == (node.engine, node.id)
    )
    job.budget = job.budget.spend()
    job.reserve(services.reservations, node.id)
    workload.engine = node.engine
    workload.submitted(node.id)
    note_affinity(services, job, plan, node, QUEUE)
    return await _attempt(services, job, outgoing, node, affine)


def _caller_id(job: Job) -> str:
    """Who the request is to the queue's turns: its key's name, else its source address."""
    caller = job.admitted.caller
    if caller is not None and caller.name is not None:
        return f"key:{caller.name}"
    return job.admitted.client or "local"


def _queue_retry(queue: FleetQueue) -> int:
    """A ``Retry-After`` for a queue's refusal: its collation bound, a fair guess at how long
    a place takes to free (at least a second)."""
    return max(1, int(queue.options.collate))


def _down(services: Services, job: Job) -> list[str]:
    """The nodes that last listed the model and are down now, as far as the mode knows, on
    every engine the facade serves."""
    admitted, scheduling = job.admitted, services.scheduling
    return sorted(
        node
        for engine in admitted.engine.serves
        for node in scheduling.owners_down(engine, model_key_on(engine, admitted))
    )


def _bound(services: Services, job: Job) -> str:
    """The wait for an owner that ran out, as the option that set it."""
    if job.budget.owner_wait_ran_out(services.clock.seconds()):
        wait = services.scheduling.owner_wait
        return f"the owner wait (--owner-wait {format_duration(wait)})"
    deadline = services.bounds.job_deadline
    return f"the job deadline (--job-deadline {format_duration(deadline)})"


async def _attempt(
    services: Services, job: Job, outgoing: Outgoing, node: Node, affine: bool = False
) -> Failed | None:
    """One dispatch (:func:`~nvpair.dispatch.delivery.try_node`), told to the mode's scheduling as
    it starts and with what its outcome says about the node (in fleet mode: the model counted as
    in memory there, docs/fleet-scheduling.md#dispatched-is-loading, and passive health,
    docs/fleet-scheduling.md#passive-health), and what the answer says of the node's cache
    (docs/fleet-scheduling.md#conversations-go-where-their-cache-is); ``affine``: affinity put
    the node first. The node is its own engine's, whatever facade the request came to."""
    scheduling = services.scheduling
    engine = node.engine
    model_key = model_key_on(engine, job.admitted)
    trial = scheduling.dispatching(engine, node.id, node.own_key(model_key))
    failed: Failed | None = None
    try:
        failed = await try_node(services, job, outgoing, node, job.budget.final)
    finally:
        # Also when the request is cancelled (the requester left, shutdown): that says nothing
        # about the node, unless the node had already answered.
        why = _against_node(job, failed)
        if why == "":
            scheduling.succeeded(engine, node.id)
            if job.served_status is not None and job.served_status < 400:
                scheduling.answered(
                    engine, node.id, model_key, job.admitted.prefix, job.stats, affine
                )
        elif why is not None:
            scheduling.failed(engine, node.id, trial, why)
    return failed


def _against_node(job: Job, failed: Failed | None) -> str | None:
    """What an attempt says about its node: a failure in a few words, "" for an answer, or
    None for nothing (the node left discovery, or the request ended before any answer)."""
    if failed is not None:
        if failed.why is Fault.NODE_LEFT:
            return None
        return f"status {failed.status}" if failed.why is Fault.STATUS else failed.why.value
    status = job.served_status
    if status is None:
        return None
    # The final attempt serves a retryable status as the answer: still the node failing.
    if classify(status, job.admitted.route) is Verdict.RETRY:
        return f"status {status}"
    return ""


def _owner_change(services: Services, engines: Sequence[str], seconds: float) -> Deferred[None]:
    """Fires after ``seconds``, or as soon as one of ``engines``' discovery snapshots changes."""
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
        if changed_engine in engines:
            wake()

    d: Deferred[None] = Deferred(lambda _: stop())
    unsubscribe = services.control.on_discovery(changed)
    timer = services.clock.callLater(max(0.0, seconds), wake)
    return d
