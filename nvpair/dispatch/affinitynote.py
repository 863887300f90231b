"""What the order did with a request's conversation, noted at its first dispatch
(docs/fleet-scheduling.md#what-the-operator-sees-of-affinity): ``followed``, ``moved`` and why,
or ``new``. The workload keeps it for ``/status`` and the access log, and ``/metrics`` counts it
(``nvpair_affinity_total``). Only fleet mode with affinity, for a request with prefix keys, has
anything to say: every other request's plan knows no conversation and nothing is noted.
"""

from __future__ import annotations

from nvpair.control.affinity import verdict
from nvpair.control.routing import Plan
from nvpair.control.state import Node
from nvpair.dispatch.job import Job, Services


def note_affinity(services: Services, job: Job, plan: Plan, node: Node, elsewhere: str) -> None:
    """``job`` is dispatched to ``node`` from ``plan``; ``elsewhere``: why it went to another
    node than the one affinity put first, if it did (``left``, ``queue``).

    Judged once, at the first dispatch: that is the order's choice. A failover after it is the
    attempts' story, which ``/status`` tells beside it."""
    known = plan.conversation
    workload = job.workload
    if known is None or job.dispatches or workload is None:
        return
    judged = verdict(known, node.engine, node.id, elsewhere)
    workload.affinity = judged
    services.counter.affinity_judged(node.engine, node.id, judged.result)
