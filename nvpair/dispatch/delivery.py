"""One attempt tried and, when it is served, its answer delivered to the client.

Delivery writes the engine's status and end-to-end headers (keeping its length framing where
the answer has one, naming the node in ``X-Nvpair-Node``), then streams the body through the
relay with the client as the upstream's consumer, under the client write deadline. A committed
answer below 400 is read for the workload's stats on the way (docs/request-path.md).
"""

from __future__ import annotations

import contextlib

from twisted.internet.defer import CancelledError
from twisted.logger import Logger

from nvpair.common.logs import debug_enabled
from nvpair.common.reasons import Reason
from nvpair.common.renaming import renamed
from nvpair.control.state import Node
from nvpair.dispatch.attempt import Failed, Fault, Outgoing, Served
from nvpair.dispatch.candidates import model_key_on
from nvpair.dispatch.job import Ending, Job, Services
from nvpair.dispatch.relay import BodyEnd, WriteDeadline
from nvpair.engines.inferstats import StatsReader
from nvpair.engines.table import RouteClass
from nvpair.wire.headers import framed_by_length, strip_hop_by_hop
from nvpair.wire.message import Fields, Flow, ResponseHead

log = Logger(namespace="nvpair.dispatch.delivery")


async def try_node(
    services: Services, job: Job, outgoing: Outgoing, node: Node, final: bool
) -> Failed | None:
    """One dispatch to ``node``: serve its answer (None), or say why it failed."""
    # A peer's request targets this node's own engine, which is no discovery node: it is the
    # sending node that reports activity toward us.
    tracking = (
        contextlib.nullcontext()
        if outgoing.route is RouteClass.PEER
        else services.activity.tracking(node.engine, node.id)
    )
    job.node = node.id
    job.node_engine = node.engine
    job.dispatches += 1
    outgoing = _for_node(job, outgoing, node)
    with tracking:
        outcome = await services.attempts.run(outgoing, node, final, job.cancelled)
        job.trail.attempt_ended(node.id, outcome)
        if isinstance(outcome, Served):
            end: BodyEnd | None = None
            try:
                end = await deliver(services, job, node, outcome)
            finally:
                _delivered(services, job, node, outcome, end is not None and end.cut)
            return None
        services.counter.attempt_ended(node.engine, node.id, outcome)
    if debug_enabled():
        log.debug(
            "attempt {attempt} to {node} failed: {why} {status} {detail}",
            engine=job.admitted.engine.id,
            attempt=job.budget.used,
            node=node.id,
            why=outcome.why.value,
            status=outcome.status,
            detail=outcome.detail,
        )
    return outcome


def _for_node(job: Job, outgoing: Outgoing, node: Node) -> Outgoing:
    """What this attempt sends: a model the request names otherwise than ``node`` does (a file
    name, an alias) is renamed to the node's own name in the body, and nothing else is
    changed (docs/model-names.md#the-node-gets-its-own-name). The name is looked up as the
    node's own engine keys it, whatever facade the request came to (docs/openai-facade.md)."""
    admitted = job.admitted
    own = node.own_name(model_key_on(node.engine, admitted))
    if own is None:
        return outgoing
    body = renamed(outgoing.body, own, admitted.member)
    return outgoing if body is None else outgoing._replace(body=body)


def _delivered(services: Services, job: Job, node: Node, served: Served, cut: bool) -> None:
    """A served attempt's answer has ended: it counts as served, or as truncated when its
    engine cut it short (docs/operations.md#recent-workloads). The workload is unchanged."""
    if cut:
        job.cut = True
        job.trail.truncated()
    services.counter.attempt_ended(node.engine, node.id, served, cut)


async def deliver(services: Services, job: Job, node: Node, served: Served) -> BodyEnd:
    """Write the served response's status and headers, then relay its body; how it ended."""
    request, head, relay = job.request, served.head, served.relay
    status = head.status
    request.respond(_answer_head(services, job, node, head))
    relay.set_deadline(lambda upstream: _write_deadline(services, job, upstream))
    clock = services.clock
    job.served(status, clock.seconds())
    reader: StatsReader | None = None
    if job.workload is not None:
        job.workload.started(node.id)
        if status < 400:
            # Only a committed answer below 400 is measured: never an error body.
            reader = StatsReader(job.created)
            feed = reader.feed
            relay.set_tap(lambda chunk: feed(chunk, clock.seconds()))
    relay.attach(request)
    try:
        end = await relay.done
    except CancelledError:
        relay.client_gone()
        raise
    finally:
        if reader is not None:
            job.stats = reader.finish(clock.seconds())
    if debug_enabled():
        log.debug(
            "{path} served by {node}: {status} complete={complete}",
            engine=job.admitted.engine.id,
            path=job.admitted.path,
            node=node.id,
            status=status,
            complete=end.complete,
        )
    return end


def _answer_head(services: Services, job: Job, node: Node, head: ResponseHead) -> ResponseHead:
    """The client's answer's head: the engine's status and its fields, which become the
    answer's (nothing sets the answer's own before its commit), stripped of its hop's in place
    rather than copied value by value (docs/performance.md#headers)."""
    fields = strip_hop_by_hop(head.fields, request=False)
    # The engine's head gives its fields up to the answer: the attempt's record of it, kept
    # while the body streams, holds no second head (docs/performance.md#held-streams).
    head.fields = Fields()
    if framed_by_length(job.admitted.method, head.status) and head.length is not None:
        # The client read Content-Length as the body's framing (``length``); putting it back
        # keeps the engine's framing (else the client would get chunked encoding).
        fields[b"Content-Length"] = [b"%d" % head.length]
    # A node id is whatever string the broker named it with: a line break in it would end the
    # field, so each is a space.
    named = _answering_node(services, node).encode()
    fields[b"X-Nvpair-Node"] = [b" ".join(named.splitlines())]
    for name, value in job.queued_field():
        fields.put(name, value)
    return ResponseHead(head.status, head.phrase, fields)


def _answering_node(services: Services, node: Node) -> str:
    """The id an answer names in ``X-Nvpair-Node``: for a peer's request, this node's."""
    if node.local:
        own = services.own_id()
        if own is not None:
            return own
    return node.id


def _write_deadline(services: Services, job: Job, upstream: Flow) -> WriteDeadline:
    timeout = services.bounds.client_write_timeout

    def expired() -> None:
        log.debug(
            "client accepted nothing for {seconds}s: dropped",
            engine=job.admitted.engine.id,
            seconds=timeout,
        )
        job.cancel(Ending.CLIENT_WRITE_TIMEOUT)
        job.request.abort()

    return WriteDeadline(upstream, services.clock, timeout, expired)


def answer_final(job: Job, failed: Failed) -> None:
    """The final permitted attempt answers for itself (docs/retry-budget.md)."""
    timed_out = failed.why is Fault.FIRST_BODY_TIMEOUT
    job.refuse(Reason.FIRST_BODY_TIMEOUT if timed_out else Reason.UPSTREAM_TRANSPORT)
