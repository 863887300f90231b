"""Requests forwarded verbatim: every route but inference and fleet-wide ones, and peers.

Non-inference routes may change state (``POST /api/pull`` starts a download), so their
candidates are resolved once and each is tried at most once: no re-resolving, no backoff, no
deadline (docs/retry-budget.md#non-inference-routes). A pinned peer's request goes to this
node's own engine and nowhere else: the peer already chose this node and runs its own failover.
A facade with no engine of its own to forward to (the ``openai`` facade) answers them 404
``not-found`` (docs/openai-facade.md#routes).
"""

from __future__ import annotations

from nvpair.common.reasons import Reason
from nvpair.control.state import Node
from nvpair.dispatch.delivery import answer_final, try_node
from nvpair.dispatch.job import Job, Services
from nvpair.engines.table import ENGINES
from nvpair.facades.answers import no_node_message

#: The node a peer's request is served by, per engine: this node's own engine (its local
#: backend).
_LOCAL = {
    engine: Node(id="local", local=True, url=None, models=(), model_keys=frozenset(), engine=engine)
    for engine in ENGINES
}


async def serve_once_each(services: Services, job: Job) -> None:
    if not job.admitted.engine.forwards_other:
        job.refuse(Reason.NOT_FOUND)
        return
    candidates = services.candidates.plan(job.admitted).candidates
    if not candidates:
        admitted = job.admitted
        engine = admitted.engine
        if admitted.path in engine.starting_paths and services.scheduling.starting(engine.id):
            # Nobody serves yet, but a node is still to say it does: the engine's own "still
            # loading" answer, which a client waiting for it to start retries on, where a 502
            # would read as gone (docs/fleet-scheduling.md#before-the-first-poll).
            job.refuse(Reason.STARTING, retry_after=1)
            return
        job.refuse(Reason.NO_OWNER, message=no_node_message(admitted.engine, admitted.model))
        return
    outgoing = job.outgoing
    for index, node in enumerate(candidates):
        final = index == len(candidates) - 1
        failed = await try_node(services, job, outgoing, node, final)
        if failed is None:
            return
        if final:
            answer_final(job, failed)


async def serve_peer(services: Services, job: Job) -> None:
    local = _LOCAL[job.admitted.engine.id]
    failed = await try_node(services, job, job.outgoing, local, True)
    if failed is not None:
        answer_final(job, failed)
