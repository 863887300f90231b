"""The fleet queue as ``/status`` shows it (docs/fleet-scheduling.md#what-the-operator-sees):
who waits for what, and for how long — no content."""

from __future__ import annotations

from nvpair.dispatch.queueing import FleetQueue


def queue_document(queue: FleetQueue, now: float) -> dict[str, object]:
    """``queue``: per facade and model, the requests waiting, the oldest's wait, and how many
    each caller has waiting (a key's name, else the caller's address) — no content."""
    document: dict[str, dict[str, object]] = {}
    for group, waiting in queue.waiting().items():
        facade = ""
        if isinstance(group, tuple):
            facade, _ = group
        # A group is one model of one engine: its first waiter's name for it stands for all.
        first, _ = waiting[0]
        shown = first.shown
        callers: dict[str, int] = {}
        for waiter, _since in waiting:
            callers[waiter.caller] = callers.get(waiter.caller, 0) + 1
        document.setdefault(str(facade), {})[shown] = {
            "waiting": len(waiting),
            "oldestMs": round(max(now - since for _, since in waiting) * 1000),
            "callers": callers,
        }
    return {
        "enabled": queue.enabled,
        "maxWaitMs": round(queue.options.max_wait * 1000),
        "maxDepth": queue.options.max_depth,
        "collateMs": round(queue.options.collate * 1000),
        "waiting": document,
    }
