"""Pure: what the multi-turn bench measured of each turn, and one side's summary of a round.

A side's figures are the client's (time to first token, statuses, the node that answered) and the
engines' own (``timings.prompt_n``, the prompt tokens an engine evaluated, and
``timings.cache_n``, the ones it took from its cache), summed per node and over the side.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import attrs

from bench.targets import percentile


@attrs.frozen
class Turn:
    """One request of a conversation, as the client saw it.

    :param status: the HTTP status; None when no answer came or the turn was never sent.
    :param node: the node that answered (``X-Nvpair-Node``), or ``""``.
    :param ttft_ms: milliseconds from starting to connect to the first token; None: none came.
    :param prompt_n: the prompt tokens the engine evaluated (its ``timings.prompt_n``).
    :param cache_n: the prompt tokens it took from its cache (``timings.cache_n``).
    :param error: why the turn failed, when it did.
    :param seconds: from starting to connect to the end of the answer (or the failure).
    """

    conversation: int
    turn: int
    status: int | None
    node: str
    ttft_ms: float | None
    prompt_n: int | None
    cache_n: int | None
    error: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error and self.ttft_ms is not None


@attrs.frozen
class NodeTokens:
    """One node's share of a side: the answers it gave and the prompt tokens behind them."""

    requests: int = 0
    evaluated: int = 0
    cached: int = 0

    @property
    def cache_share(self) -> float | None:
        total = self.evaluated + self.cached
        return self.cached / total if total else None


@attrs.frozen
class SideSummary:
    """One side of a round.

    :param statuses: how many turns ended with each status (``"none"``: no answer, or never
        sent).
    :param evaluated: the sum of the answers' ``timings.prompt_n``.
    :param cached: the sum of their ``timings.cache_n``.
    :param busiest_share: the busiest node's answers over a fair share (answers / nodes).
    :param followups: answered turns after an answered first one of their conversation.
    :param stayed: those answered by the node that answered the conversation's turn before.
    :param in_flight: requests in flight on average over the side's run (the sum of the turns'
        times over ``elapsed``); None when no run time was given.
    :param least: the fewest prompt tokens any order could have had evaluated: each
        conversation's longest answered prompt (``prompt_n + cache_n``), read once. Every turn
        is the turn before plus its reply and a new message, so a node that kept each
        conversation whole would have read exactly that.
    """

    requests: int
    failed: int
    statuses: Mapping[str, int]
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    evaluated: int
    cached: int
    nodes: Mapping[str, NodeTokens]
    busiest_share: float | None
    followups: int = 0
    stayed: int = 0
    in_flight: float | None = None
    least: int = 0


def _least(turns: Sequence[Turn]) -> int:
    longest: dict[int, int] = {}
    for t in turns:
        if t.ok:
            total = (t.prompt_n or 0) + (t.cache_n or 0)
            longest[t.conversation] = max(longest.get(t.conversation, 0), total)
    return sum(longest.values())


def _stayed(turns: Sequence[Turn]) -> tuple[int, int]:
    """(follow-up turns answered after an answered turn, those on that turn's node)."""
    answered = {(t.conversation, t.turn): t.node for t in turns if t.ok}
    followups = stayed = 0
    for (conversation, turn), node in answered.items():
        before = answered.get((conversation, turn - 1))
        if before is not None:
            followups += 1
            stayed += before == node
    return followups, stayed


def summarize(
    turns: Sequence[Turn], nodes: Sequence[str], elapsed: float | None = None
) -> SideSummary:
    """``turns`` of one side over ``nodes`` (every node counted, the idle ones as zero), played
    in ``elapsed`` seconds."""
    ok = [t for t in turns if t.ok]
    ttfts = [t.ttft_ms for t in ok if t.ttft_ms is not None]
    per_node: dict[str, NodeTokens] = {name: NodeTokens() for name in nodes}
    for t in ok:
        seen = per_node.get(t.node, NodeTokens())
        per_node[t.node] = NodeTokens(
            seen.requests + 1,
            seen.evaluated + (t.prompt_n or 0),
            seen.cached + (t.cache_n or 0),
        )
    fair = len(ok) / len(per_node) if per_node and ok else None
    busiest = max((n.requests for n in per_node.values()), default=0)
    statuses = Counter("none" if t.status is None else str(t.status) for t in turns)
    followups, stayed = _stayed(turns)
    return SideSummary(
        requests=len(turns),
        failed=len(turns) - len(ok),
        statuses=dict(sorted(statuses.items())),
        ttft_p50_ms=percentile(ttfts, 50) if ttfts else None,
        ttft_p90_ms=percentile(ttfts, 90) if ttfts else None,
        evaluated=sum(n.evaluated for n in per_node.values()),
        cached=sum(n.cached for n in per_node.values()),
        nodes=per_node,
        busiest_share=busiest / fair if fair else None,
        followups=followups,
        stayed=stayed,
        in_flight=sum(t.seconds for t in turns) / elapsed if elapsed else None,
        least=_least(turns),
    )


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def side_table(summaries: Mapping[str, SideSummary]) -> list[str]:
    """One round's sides as a text table, a column per side."""
    sides = list(summaries)
    nodes = sorted({name for s in summaries.values() for name in s.nodes if name})
    rows: list[tuple[str, list[str]]] = [
        ("requests (failed)", [f"{s.requests} ({s.failed})" for s in summaries.values()]),
        (
            "statuses",
            [", ".join(f"{k}: {v}" for k, v in s.statuses.items()) for s in summaries.values()],
        ),
        (
            "TTFT p50 / p90 (ms)",
            [f"{_ms(s.ttft_p50_ms)} / {_ms(s.ttft_p90_ms)}" for s in summaries.values()],
        ),
        ("prompt tokens evaluated", [f"{s.evaluated:,}" for s in summaries.values()]),
        ("prompt tokens from cache", [f"{s.cached:,}" for s in summaries.values()]),
        ("least any order evaluates", [f"{s.least:,}" for s in summaries.values()]),
        (
            "follow-ups on the turn before's node",
            [f"{s.stayed} of {s.followups}" for s in summaries.values()],
        ),
        (
            "requests in flight, mean",
            ["—" if s.in_flight is None else f"{s.in_flight:.2f}" for s in summaries.values()],
        ),
        (
            "busiest node / fair share",
            [
                "—" if s.busiest_share is None else f"{s.busiest_share:.2f}"
                for s in summaries.values()
            ],
        ),
    ]
    for name in nodes:
        rows.append(
            (
                f"{name}: answers, evaluated, cached",
                [_node_cell(s.nodes.get(name)) for s in summaries.values()],
            )
        )
    width = max(len(label) for label, _ in rows)
    widths = [max(len(side), *(len(cells[i]) for _, cells in rows)) for i, side in enumerate(sides)]
    out = [
        " " * width + "  " + "  ".join(side.rjust(w) for side, w in zip(sides, widths, strict=True))
    ]
    for label, cells in rows:
        out.append(
            label.ljust(width)
            + "  "
            + "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))
        )
    return out


def _node_cell(tokens: NodeTokens | None) -> str:
    if tokens is None:
        return "—"
    return f"{tokens.requests}, {tokens.evaluated:,}, {tokens.cached:,}"
