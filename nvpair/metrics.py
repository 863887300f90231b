"""What the request path counts for ``/metrics`` (docs/operations.md#metrics).

Counting sits on the request path, so it is plain arithmetic on dictionaries keyed by label
values — a few hundred nanoseconds per request — and nothing is formatted until ``/metrics``
is scraped; then :mod:`nvpair.exposition` reads these counts (and the live process state)
into prometheus-client's metric families. This module imports no prometheus-client: a process
without an admin listener neither counts nor loads it. Label values are operational only —
engine, node id, route class, a proxy reason — never request content, so their number is
bounded by the fleet and the contract's reason list.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from nvpair.attempt import Failed, Fault, Outcome

#: Seconds: from a fast local answer to a cold model load on a slow disk.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
#: Tokens per second: from a CPU-only laptop to a data-center GPU.
RATE_BUCKETS = (1, 2, 5, 10, 20, 35, 50, 75, 100, 150, 250, 500, 1000)

_FAULT_RESULTS = {
    Fault.STATUS: "status",
    Fault.TRANSPORT: "transport",
    Fault.FIRST_BODY_TIMEOUT: "first_body_timeout",
    Fault.NODE_LEFT: "node_left",
}


class Histogram:
    """Observations per label tuple: a count per bucket (not yet cumulative) and a sum."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        series = self.series.get(labels)
        if series is None:
            # One more slot than bounds: the +Inf bucket.
            series = self.series[labels] = ([0] * (len(self.bounds) + 1), [0.0])
        counts, total = series
        counts[bisect.bisect_left(self.bounds, value)] += 1
        total[0] += value


class Metrics:
    """What the request path counts (the counters and histograms of the contract's table)."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, str], int] = {}
        self.attempts: dict[tuple[str, str, str], int] = {}
        self.failovers: dict[str, int] = {}
        self.tokens: dict[tuple[str, str], int] = {}
        self.first_byte = Histogram(LATENCY_BUCKETS)
        self.duration = Histogram(LATENCY_BUCKETS)
        self.rate = Histogram(RATE_BUCKETS)

    def attempt_ended(self, engine: str, node: str, outcome: Outcome) -> None:
        result = _FAULT_RESULTS[outcome.why] if isinstance(outcome, Failed) else "served"
        key = (engine, node, result)
        self.attempts[key] = self.attempts.get(key, 0) + 1

    def request_ended(
        self,
        engine: str,
        route: str,
        outcome: str,
        dispatches: int,
        seconds: float,
        first_byte: float | None,
    ) -> None:
        """One request ended.

        :param outcome: ``served``, the proxy's reason, or ``cancelled``.
        :param dispatches: how many attempts it made; each after the first is a failover.
        :param first_byte: seconds from admission to the first byte of the served answer.
        """
        key = (engine, route, outcome)
        self.requests[key] = self.requests.get(key, 0) + 1
        if dispatches > 1:
            self.failovers[engine] = self.failovers.get(engine, 0) + dispatches - 1
        self.duration.observe((engine, route), seconds)
        if first_byte is not None:
            self.first_byte.observe((engine,), first_byte)

    def measured(
        self, engine: str, prompt: int | None, completion: int | None, rate: float | None
    ) -> None:
        """A served answer's token statistics (the workload's own stats)."""
        if prompt:
            key = (engine, "prompt")
            self.tokens[key] = self.tokens.get(key, 0) + prompt
        if completion:
            key = (engine, "completion")
            self.tokens[key] = self.tokens.get(key, 0) + completion
        if rate is not None:
            self.rate.observe((engine,), rate)
