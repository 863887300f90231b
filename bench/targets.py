"""Pure judging: per-round measurements in, PASS/MISS verdicts out.

Every scenario runs in rounds with the contenders taking turns, so a target compares numbers
from the same round (nvpair against the floor measured a few seconds apart on the same machine
state) and the verdict is on the median of those per-round figures. The thresholds are the
issue's targets.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Callable, Mapping, Sequence

import attrs

Rounds = Sequence[float | None]
"""One value per round; None where that round could not measure it."""
Table = Mapping[str, Mapping[str, Rounds]]
"""metric -> contender -> rounds."""


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank percentile (``p`` in 0..100) of a non-empty sample."""
    if not values:
        raise ValueError("percentile of nothing")
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def median(values: Rounds) -> float | None:
    present = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(present) if present else None


def rounds(table: Table, metric: str, contender: str) -> Rounds:
    return table.get(metric, {}).get(contender, ())


def ratios(table: Table, metric: str, a: str, b: str) -> list[float | None]:
    """``a / b`` per round (None where either is missing or ``b`` is zero)."""
    out: list[float | None] = []
    for x, y in zip(rounds(table, metric, a), rounds(table, metric, b), strict=False):
        out.append(x / y if x is not None and y else None)
    return out


def fewer(table: Table, metric: str, a: str, b: str) -> list[float | None]:
    """How many times fewer ``b`` counted than ``a``, per round: ``a / b`` for counts, with a
    round in which ``b`` counted none taken as one (a lower bound, not a round left out)."""
    out: list[float | None] = []
    for x, y in zip(rounds(table, metric, a), rounds(table, metric, b), strict=False):
        out.append(x / max(y, 1.0) if x is not None and y is not None else None)
    return out


def differences(table: Table, metric: str, a: str, b: str) -> list[float | None]:
    """``a - b`` per round."""
    out: list[float | None] = []
    for x, y in zip(rounds(table, metric, a), rounds(table, metric, b), strict=False):
        out.append(x - y if x is not None and y is not None else None)
    return out


class Verdict(enum.Enum):
    PASS = "PASS"
    MISS = "MISS"
    NA = "n/a"


@attrs.frozen
class Target:
    """One line of the issue's table.

    :param name: what is promised, as the issue words it.
    :param per_round: the judged figure of each round, from the measurements.
    :param bound: the threshold.
    :param at_most: True when the figure must be at most ``bound``, else at least.
    :param unit: how the figure is printed (``x``, ``ms``, ``MB``, ...).
    :param reduce: how the rounds are combined (median by default).
    """

    name: str
    per_round: Callable[[Table], Sequence[float | None]]
    bound: float
    at_most: bool
    unit: str
    reduce: Callable[[Rounds], float | None] = median


@attrs.frozen
class Judged:
    target: Target
    value: float | None
    per_round: tuple[float | None, ...]
    verdict: Verdict


def judge(target: Target, table: Table) -> Judged:
    per_round = tuple(target.per_round(table))
    value = target.reduce(per_round)
    if value is None:
        verdict = Verdict.NA
    elif value <= target.bound if target.at_most else value >= target.bound:
        verdict = Verdict.PASS
    else:
        verdict = Verdict.MISS
    return Judged(target, value, per_round, verdict)


def worst(values: Rounds) -> float | None:
    """The largest value: for a promise that must hold in every round."""
    present = [v for v in values if v is not None]
    return max(present) if present else None


def flatness(table: Table) -> list[float | None]:
    """Per round: the largest departure of routing cost from the 2-node cost, in percent."""
    costs = table.get("route_us", {})
    base = costs.get("2", ())
    out: list[float | None] = []
    for index, two in enumerate(base):
        if two is None or two <= 0:
            out.append(None)
            continue
        spread = []
        for values in costs.values():
            value = values[index] if index < len(values) else None
            if value is not None:
                spread.append(abs(value / two - 1) * 100)
        out.append(max(spread) if spread else None)
    return out


def added_over(table: Table, other: str) -> list[float | None]:
    """Per round: nvpair's added c=1 p50 latency over ``other``'s, both over the direct path."""
    ours = differences(table, "latency_p50_ms", "nvpair", "direct")
    theirs = differences(table, "latency_p50_ms", other, "direct")
    out: list[float | None] = []
    for x, y in zip(ours, theirs, strict=False):
        out.append(x / y if x is not None and y is not None and y > 0 else None)
    return out


def added_over_nginx(table: Table) -> list[float | None]:
    """Per round: nvpair's added c=1 p50 latency over nginx's, both over the direct path."""
    return added_over(table, "nginx")


def summed(table: Table, metric: str, a: str, b: str) -> list[float | None]:
    """``a + b`` per round; None where either did not run."""
    out: list[float | None] = []
    for x, y in zip(rounds(table, metric, a), rounds(table, metric, b), strict=False):
        out.append(x + y if x is not None and y is not None else None)
    return out


def over_least(table: Table) -> list[float | None]:
    """Per round: the prompt tokens the engines evaluated with affinity over the fewest any
    order could have had them evaluate (each conversation's longest prompt, read once)."""
    out: list[float | None] = []
    for x, y in zip(
        rounds(table, "mt_evaluated", "affinity-on"),
        rounds(table, "mt_least", "affinity-on"),
        strict=False,
    ):
        out.append(x / y if x is not None and y else None)
    return out


def busiest_either(table: Table) -> list[float | None]:
    """Per round: the busiest node's share of requests over a fair share, the larger of the
    two sides'."""
    out: list[float | None] = []
    for x, y in zip(
        rounds(table, "mt_busiest_share", "affinity-off"),
        rounds(table, "mt_busiest_share", "affinity-on"),
        strict=False,
    ):
        out.append(max(x, y) if x is not None and y is not None else None)
    return out


def counters_off_by(table: Table) -> list[float | None]:
    """Per round: how far the engines' own ``/metrics`` counters (evaluated and cached prompt
    tokens) are from the sums of their answers' ``timings``, both sides, in tokens; None where
    a side did not run."""
    per_pair = [
        [
            abs(e - a) if e is not None and a is not None else None
            for e, a in zip(rounds(table, engine, side), rounds(table, answers, side), strict=False)
        ]
        for side in ("affinity-off", "affinity-on")
        for engine, answers in (
            ("mt_engine_evaluated", "mt_evaluated"),
            ("mt_engine_cached", "mt_cached"),
        )
    ]
    out: list[float | None] = []
    for values in zip(*per_pair, strict=False):
        present = [v for v in values if v is not None]
        out.append(max(present) if len(present) == len(values) else None)
    return out


def both_sides_failed(table: Table) -> list[float | None]:
    """Per round: the multi-turn requests not answered 200 (or broken), both sides together;
    None where either side did not run."""
    return summed(table, "mt_failed", "affinity-off", "affinity-on")


def contention_failed(table: Table) -> list[float | None]:
    """Per round: the contention bench's fairness requests not answered in full, both sides
    together (those cut at the end of a run aside); None where either side did not run."""
    return summed(table, "ct_fair_failed", "queue-off", "queue-on")


def collation_wait(table: Table) -> list[float | None]:
    """Per round: the queue's longest wait in the collation part over its bound (``collate``
    plus two service times); at most 1 holds the promise."""
    longest = rounds(table, "ct_coll_queued_max_ms", "queue-on")
    bound = rounds(table, "ct_coll_bound_ms", "queue-on")
    return [x / y if x is not None and y else None for x, y in zip(longest, bound, strict=False)]


def priority_bound(table: Table) -> list[float | None]:
    """Per round, with the queue: the ``high`` key's TTFT p95 beside the ``low`` flood over
    1.5 times its TTFT p95 on the idle fleet plus one service time; at most 1 holds it."""
    out: list[float | None] = []
    flooded = rounds(table, "ct_prio_high_p95_ms", "queue-on")
    idle = rounds(table, "ct_prio_idle_p95_ms", "queue-on")
    service = rounds(table, "ct_prio_service_ms", "queue-on")
    for x, i, s in zip(flooded, idle, service, strict=False):
        out.append(x / (1.5 * i + s) if x is not None and i is not None and s else None)
    return out


# Throughput (req/s, streams/s) is reported beside these, not judged: on two shared cores the
# engines and the load generator bound it whatever the proxy does (bench/README.md), so the
# proxy is judged on its own CPU and memory per unit of work.
TARGETS: tuple[Target, ...] = (
    Target(
        "proxy CPU per non-streamed request at c=32 <= 0.75x the floor's (issue 34's guard)",
        lambda t: ratios(t, "cpu_per_request_us", "nvpair", "floor"),
        0.75,
        True,
        "x",
    ),
    Target(
        "proxy CPU per 64-chunk stream <= 0.6x the floor's",
        lambda t: ratios(t, "cpu_per_stream_us", "nvpair", "floor"),
        0.6,
        True,
        "x",
    ),
    Target(
        "added latency p50 at c=1 <= 2x nginx's added latency",
        added_over_nginx,
        2,
        True,
        "x",
    ),
    Target(
        "added latency p50 at c=1 <= 0.6x the floor's added latency (issue 34's guard)",
        lambda t: added_over(t, "floor"),
        0.6,
        True,
        "x",
    ),
    Target(
        "held streams: all intact (broken streams, worst round)",
        lambda t: rounds(t, "held_broken", "nvpair"),
        0,
        True,
        "",
        worst,
    ),
    Target(
        "held streams: TTFB p99 <= 250 ms",
        lambda t: rounds(t, "held_ttfb_p99_ms", "nvpair"),
        250,
        True,
        "ms",
    ),
    Target(
        "held streams: worst inter-chunk gap p99 <= 1.15 s",
        lambda t: rounds(t, "held_gap_p99_s", "nvpair"),
        1.15,
        True,
        "s",
    ),
    Target(
        "held streams: peak RSS <= 1.3x the floor's (issue 34's guard)",
        lambda t: ratios(t, "held_rss_mb", "nvpair", "floor"),
        1.3,
        True,
        "x",
    ),
    Target(
        "failover on a 503 adds <= 1 ms to TTFB",
        lambda t: rounds(t, "failover_added_ms:503", "nvpair"),
        1,
        True,
        "ms",
    ),
    Target(
        "failover on a refused connection adds <= 5 ms to TTFB",
        lambda t: rounds(t, "failover_added_ms:refused", "nvpair"),
        5,
        True,
        "ms",
    ),
    Target(
        "routing cost flat (+-20 %) from 2 to 256 nodes, 10,000 models",
        flatness,
        20,
        True,
        "%",
    ),
    Target(
        "LiteLLM still >= 30x behind nvpair (req/s at c=32)",
        lambda t: ratios(t, "rps_c32", "nvpair", "litellm"),
        30,
        False,
        "x",
    ),
    Target(
        "/metrics counting costs <= 3 % CPU per request (with an admin listener / without)",
        lambda t: ratios(t, "metrics_cpu_us", "nvpair+metrics", "nvpair"),
        1.03,
        True,
        "x",
    ),
    Target(
        "/metrics counting costs <= 3 % user-space instructions per request",
        lambda t: ratios(t, "instructions_k", "nvpair+metrics", "nvpair"),
        1.03,
        True,
        "x",
    ),
    Target(
        "cold-start mix: streamed requests that waited for a load >= 3x fewer, warm-aware "
        "order (default / warm-aware)",
        lambda t: fewer(t, "mix_waited", "default", "warm-aware"),
        3,
        False,
        "x",
    ),
    Target(
        "cold-start mix: cold starts >= 3x fewer, warm-aware order (default / warm-aware)",
        lambda t: fewer(t, "mix_cold_starts", "default", "warm-aware"),
        3,
        False,
        "x",
    ),
    Target(
        "multi-turn: prompt tokens the engines evaluated with affinity <= 1.25x the least any "
        "order could (on / least)",
        over_least,
        1.25,
        True,
        "x",
    ),
    Target(
        "multi-turn: prompt tokens the engines evaluated >= 1.6x fewer with affinity (off / on)",
        lambda t: ratios(t, "mt_evaluated", "affinity-off", "affinity-on"),
        1.6,
        False,
        "x",
    ),
    Target(
        "multi-turn: follow-ups on the node of the turn before >= 90 % with affinity",
        lambda t: [None if v is None else v * 100 for v in rounds(t, "mt_stayed", "affinity-on")],
        90,
        False,
        "%",
    ),
    Target(
        "multi-turn: TTFT p50 >= 1.5x lower with affinity (off / on)",
        lambda t: ratios(t, "mt_ttft_p50_ms", "affinity-off", "affinity-on"),
        1.5,
        False,
        "x",
    ),
    Target(
        "multi-turn: busiest node's requests <= 1.5x a fair share on both sides (worst round)",
        busiest_either,
        1.5,
        True,
        "x",
        worst,
    ),
    Target(
        "multi-turn: the engines' /metrics counters equal their answers' sums (tokens off, "
        "worst round)",
        counters_off_by,
        0,
        True,
        "",
        worst,
    ),
    Target(
        "multi-turn: every request answered 200 on both sides (failed, worst round)",
        both_sides_failed,
        0,
        True,
        "",
        worst,
    ),
    Target(
        "contention, fairness: the second caller's TTFT p95 >= 5x lower with the queue (off / on)",
        lambda t: ratios(t, "ct_fair_chat_p95_ms", "queue-off", "queue-on"),
        5,
        False,
        "x",
    ),
    Target(
        "contention, fairness: the first caller's completed requests >= 0.95x with the queue "
        "(on / off)",
        lambda t: ratios(t, "ct_fair_flood_done", "queue-on", "queue-off"),
        0.95,
        False,
        "x",
    ),
    Target(
        "contention, fairness: nothing failed on either side (failed, worst round)",
        contention_failed,
        0,
        True,
        "",
        worst,
    ),
    Target(
        "contention, late binding: TTFT p99 >= 1.5x lower with the queue (off / on)",
        lambda t: ratios(t, "ct_late_p99_ms", "queue-off", "queue-on"),
        1.5,
        False,
        "x",
    ),
    Target(
        "contention, late binding: completed requests >= 0.98x with the queue (on / off)",
        lambda t: ratios(t, "ct_late_done", "queue-on", "queue-off"),
        0.98,
        False,
        "x",
    ),
    Target(
        "contention, collation: model loads >= 2x fewer with the queue (off / on)",
        lambda t: fewer(t, "ct_coll_loads", "queue-off", "queue-on"),
        2,
        False,
        "x",
    ),
    Target(
        "contention, collation: no request waited longer than collate + two service times "
        "(longest queued / that, worst round)",
        collation_wait,
        1,
        True,
        "x",
        worst,
    ),
    Target(
        "contention, priority: the high key's TTFT p95 beside a low flood <= 1.5x its TTFT p95 "
        "on the idle fleet + one service time (measured / that)",
        priority_bound,
        1,
        True,
        "x",
    ),
    Target(
        "contention, real engines: the second caller's TTFT p95 >= 3x lower with the queue "
        "(off / on)",
        lambda t: ratios(t, "ct_real_chat_p95_ms", "queue-off", "queue-on"),
        3,
        False,
        "x",
    ),
)
