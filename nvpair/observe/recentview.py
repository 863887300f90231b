"""The last workloads as ``/status`` shows them (docs/operations.md#status): the path each
took and how it ended — never content."""

from __future__ import annotations

from datetime import UTC, datetime

from nvpair.control.affinity import Verdict
from nvpair.engines.inferstats import Stats
from nvpair.observe.recent import RecentWorkloads, Trail


def _when(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


def _when_ms(milliseconds: int | None) -> str | None:
    return None if milliseconds is None else _when(milliseconds / 1000)


#: Fewer tokens than this make no rate worth showing: a tiny answer's few tokens come out of one
#: batch, and the engine's figure (10,481/s for 12 tokens) says nothing of its decode speed.
MIN_RATE_TOKENS = 16


def measurable(stats: Stats) -> bool:
    """Whether an answer is long enough for its tokens per second to mean something."""
    return (stats.completion_tokens or 0) >= MIN_RATE_TOKENS


def recent_workload(trail: Trail) -> dict[str, object]:
    """One entry of ``recent``: a workload, the path it took and how it ended — no content.

    ``tokensPerSecond`` is shown only when the engine reported usage, for an answer of at least
    :data:`MIN_RATE_TOKENS` tokens: a rate derived from counted stream events (``estimated``),
    or from a handful of tokens, is too rough to put beside a node's real figure.
    """
    workload = trail.workload
    stats, judged = workload.stats, workload.affinity
    return {
        "id": workload.id,
        "engine": workload.engine,
        "model": workload.model,
        "state": workload.state.value,
        # The terminal event's error: the proxy's reason when it answered for itself
        # (``deadline``, ``upstream-transport``, ...), ``upstream status N`` for an engine's
        # error relayed, the cancellation's cause; None in flight and when completed.
        "error": workload.error,
        "attempts": [
            {
                "node": attempt.node,
                "result": attempt.result,
                "status": attempt.status,
                "detail": attempt.detail or None,
            }
            for attempt in trail.attempts
        ],
        "ttftMs": stats.ttft_ms if stats is not None else None,
        "tokensPerSecond": stats.tokens_per_second
        if stats is not None and not stats.estimated and measurable(stats)
        else None,
        # The facade it came through: the openai facade's requests are served by an engine of
        # their node's (docs/openai-facade.md).
        "facade": workload.facade or workload.engine,
        "admittedAt": _when_ms(workload.created_at),
        "endedAt": _when_ms(workload.completed_at),
        # Fleet mode's queue: how long it waited for a place, if it waited.
        "queuedMs": workload.queued_ms,
        # Fleet mode with affinity: what the order did with its conversation at its first
        # dispatch, why it moved, and the conversation's node
        # (docs/fleet-scheduling.md#what-the-operator-sees-of-affinity).
        **({} if judged is None else _affinity(judged)),
        # Where [access] is in force: the fleet key it came with (docs/lan.md#keys).
        **({} if workload.caller is None else {"key": workload.caller.name}),
    }


def _affinity(judged: Verdict) -> dict[str, object]:
    return {"affinity": judged.result, "affinityWhy": judged.why, "affinityNode": judged.node}


def recent_document(recent: RecentWorkloads | None) -> list[dict[str, object]]:
    """``recent``: the last workloads, newest first (empty when nothing records them)."""
    if recent is None:
        return []
    return [recent_workload(trail) for trail in recent.newest_first()]
