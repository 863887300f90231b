"""What the request path counts for ``/metrics`` (docs/operations.md#metrics).

Counting sits on the request path, so it is plain arithmetic on dictionaries keyed by label
values — a few hundred nanoseconds per request — and nothing is formatted until ``/metrics``
is scraped; then :mod:`nvpair.observe.exposition` reads these counts (and the live process state)
into prometheus-client's metric families. This module imports no prometheus-client: a process
without an admin listener neither counts nor loads it. Label values are operational only —
engine, node id, route class, a proxy reason — never request content, so their number is
bounded by the fleet and by :class:`~nvpair.common.reasons.Reason`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from nvpair.dispatch.attempt import RESULTS, SERVED, TRUNCATED, Failed, Outcome
from nvpair.engines.inferstats import Stats

#: Seconds: from a fast local answer to a cold model load on a slow disk.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
#: Tokens per second: from a CPU-only laptop to a data-center GPU.
RATE_BUCKETS = (1, 2, 5, 10, 20, 35, 50, 75, 100, 150, 250, 500, 1000)


class Histogram:
    """Observations per label tuple: a count per bucket (not yet cumulative) and a sum."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        #: Per label tuple: one count per bucket, the +Inf bucket last, and the sum.
        self.series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}


class _Ended:
    """Everything counted of the requests that ended with one (engine, route, outcome): one
    dictionary lookup per request finds it all; the families are summed from these when
    scraped."""

    __slots__ = (
        "cached",
        "completion",
        "count",
        "duration",
        "duration_sum",
        "failovers",
        "first_byte",
        "first_byte_sum",
        "prompt",
        "rate",
        "rate_sum",
    )

    def __init__(self) -> None:
        self.count = 0
        self.failovers = 0
        # One more slot than bounds: the +Inf bucket.
        self.duration = [0] * (len(LATENCY_BUCKETS) + 1)
        self.duration_sum = 0.0
        self.first_byte = [0] * (len(LATENCY_BUCKETS) + 1)
        self.first_byte_sum = 0.0
        self.prompt = 0
        self.cached = 0
        self.completion = 0
        self.rate = [0] * (len(RATE_BUCKETS) + 1)
        self.rate_sum = 0.0


def _add(histogram: Histogram, labels: tuple[str, ...], counts: list[int], total: float) -> None:
    """Fold one series' bucket counts into ``histogram``'s ``labels`` series."""
    if not any(counts):
        return
    series = histogram.series.get(labels)
    if series is None:
        series = histogram.series[labels] = ([0] * len(counts), [0.0])
    into, into_total = series
    for index, count in enumerate(counts):
        into[index] += count
    into_total[0] += total


class Metrics:
    """What the request path counts (the counters and histograms of docs/operations.md#metrics).

    Counted per request: :meth:`attempt_ended` per dispatch, :meth:`request_ended` per
    request. Read per scrape: the properties, summed over what was counted.
    """

    def __init__(self) -> None:
        self.attempts: dict[tuple[str, str, str], int] = {}
        self._ended: dict[tuple[str, str, str], _Ended] = {}
        #: Requests ended by (key, engine, outcome), of those that came with a fleet key.
        self.keyed: dict[tuple[str, str, str], int] = {}
        #: The wait of every request that waited in fleet mode's queue, by engine.
        self.queue_wait = Histogram(LATENCY_BUCKETS)
        #: Requests by (engine, node, affinity's result) of their first dispatch (fleet mode).
        self.affinity: dict[tuple[str, str, str], int] = {}
        #: Prompt tokens read from cache, by (engine, node) that answered.
        self.cached: dict[tuple[str, str], int] = {}

    def attempt_ended(self, engine: str, node: str, outcome: Outcome, cut: bool = False) -> None:
        """A dispatch ended: failed, or served and its answer delivered (``cut``: truncated
        by its engine). A served one is counted once its body has ended, so a cut stream
        counts as truncated and never also as served."""
        if isinstance(outcome, Failed):
            result = RESULTS[outcome.why]
        else:
            result = TRUNCATED if cut else SERVED
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
        stats: Stats | None = None,
    ) -> None:
        """One request ended.

        :param outcome: ``served``, the proxy's reason (a ``Reason``'s value), or ``cancelled``.
        :param dispatches: how many attempts it made; each after the first is a failover.
        :param first_byte: seconds from admission to the first byte of the served answer.
        :param stats: the served answer's token statistics (the workload's own).
        """
        key = (engine, route, outcome)
        ended = self._ended.get(key)
        if ended is None:
            ended = self._ended[key] = _Ended()
        ended.count += 1
        if dispatches > 1:
            ended.failovers += dispatches - 1
        ended.duration[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        ended.duration_sum += seconds
        if first_byte is not None:
            ended.first_byte[bisect.bisect_left(LATENCY_BUCKETS, first_byte)] += 1
            ended.first_byte_sum += first_byte
        if stats is not None:
            ended.prompt += stats.prompt_tokens or 0
            ended.cached += stats.cached_tokens or 0
            ended.completion += stats.completion_tokens or 0
            rate = stats.tokens_per_second
            if rate is not None:
                ended.rate[bisect.bisect_left(RATE_BUCKETS, rate)] += 1
                ended.rate_sum += rate

    def request_refused(self, engine: str, route: str, outcome: str) -> None:
        """A request refused before the request path (at its head, for its body): counted in
        ``nvpair_requests_total`` beside every other refusal, in no histogram (it took no time
        worth measuring, and no node was asked; docs/operations.md#metrics)."""
        key = (engine, route, outcome)
        ended = self._ended.get(key)
        if ended is None:
            ended = self._ended[key] = _Ended()
        ended.count += 1

    def key_request_ended(self, key: str, engine: str, outcome: str) -> None:
        """A request that came with the fleet key ``key`` ended (docs/lan.md#keys)."""
        labels = (key, engine, outcome)
        self.keyed[labels] = self.keyed.get(labels, 0) + 1

    def affinity_judged(self, engine: str, node: str, result: str) -> None:
        """A request's first dispatch, to ``engine``'s ``node``: affinity's ``result``
        (docs/fleet-scheduling.md#what-the-operator-sees-of-affinity)."""
        labels = (engine, node, result)
        self.affinity[labels] = self.affinity.get(labels, 0) + 1

    def cached_read(self, engine: str, node: str, tokens: int) -> None:
        """``engine`` on ``node`` answered reading ``tokens`` prompt tokens from its cache."""
        labels = (engine, node)
        self.cached[labels] = self.cached.get(labels, 0) + tokens

    def queue_waited(self, engine: str, seconds: float) -> None:
        """A request that waited in fleet mode's queue ended, served or not."""
        counts = [0] * (len(LATENCY_BUCKETS) + 1)
        counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] = 1
        _add(self.queue_wait, (engine,), counts, seconds)

    # -- read when scraped ------------------------------------------------------------------

    @property
    def requests(self) -> dict[tuple[str, str, str], int]:
        return {key: ended.count for key, ended in self._ended.items()}

    @property
    def failovers(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for (engine, _, _), ended in self._ended.items():
            if ended.failovers:
                out[engine] = out.get(engine, 0) + ended.failovers
        return out

    @property
    def tokens(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for (engine, _, _), ended in self._ended.items():
            kinds = (
                ("prompt", ended.prompt),
                ("cached", ended.cached),
                ("completion", ended.completion),
            )
            for kind, count in kinds:
                if count:
                    out[(engine, kind)] = out.get((engine, kind), 0) + count
        return out

    @property
    def duration(self) -> Histogram:
        """By engine and route."""
        histogram = Histogram(LATENCY_BUCKETS)
        for (engine, route, _), ended in self._ended.items():
            _add(histogram, (engine, route), ended.duration, ended.duration_sum)
        return histogram

    @property
    def first_byte(self) -> Histogram:
        """By engine."""
        histogram = Histogram(LATENCY_BUCKETS)
        for (engine, _, _), ended in self._ended.items():
            _add(histogram, (engine,), ended.first_byte, ended.first_byte_sum)
        return histogram

    @property
    def rate(self) -> Histogram:
        """By engine."""
        histogram = Histogram(RATE_BUCKETS)
        for (engine, _, _), ended in self._ended.items():
            _add(histogram, (engine,), ended.rate, ended.rate_sum)
        return histogram
