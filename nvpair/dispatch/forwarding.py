"""Requests forwarded verbatim: every route but inference and fleet-wide ones, and peers.

Non-inference routes may change state (``POST /api/pull`` starts a download), so their
candidates are resolved once and each is tried at most once: no re-resolving, no backoff, no
deadline (docs/retry-budget.md#non-inference-routes). A pinned peer's request goes to this
node's own engine and nowhere else: the peer already chose this node and runs its own failover.
"""

from __future__ import annotations

from nvpair.common.reasons import Reason
from nvpair.control.state import Node
from nvpair.dispatch.delivery import answer_final, try_node
from nvpair.dispatch.job import Job, Services
from nvpair.facades.answers import no_node_message

#: The node a peer's request is served by: this node's own engine (its local backend).
_LOCAL = Node(id="local", local=True, url=None, models=(), model_keys=frozenset())


async def serve_once_each(services: Services, job: Job) -> None:
    candidates = services.candidates.plan(job.admitted).candidates
    if not candidates:
        admitted = job.admitted
        job.refuse(Reason.NO_OWNER, message=no_node_message(admitted.engine, admitted.model))
        return
    outgoing = job.outgoing()
    for index, node in enumerate(candidates):
        final = index == len(candidates) - 1
        failed = await try_node(services, job, outgoing, node, final)
        if failed is None:
            return
        if final:
            answer_final(job, failed)


async def serve_peer(services: Services, job: Job) -> None:
    failed = await try_node(services, job, job.outgoing(), _LOCAL, True)
    if failed is not None:
        answer_final(job, failed)
