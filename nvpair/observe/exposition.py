"""``/metrics``: the counts of :mod:`nvpair.observe.metrics` and the live process state, as
prometheus-client's metric families (docs/operations.md#metrics).

Imported by the admin listener only. :class:`MetricsCollector` reads everything when scraped;
prometheus-client writes the exposition format.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from nvpair.engines.table import served_engines
from nvpair.observe.metrics import Histogram, Metrics


def _counter(
    name: str,
    documentation: str,
    labels: Sequence[str],
    counts: Iterable[tuple[tuple[str, ...], int]],
) -> Metric:
    """A counter family: one sample per label tuple counted (``(labels, count)`` pairs)."""
    family = CounterMetricFamily(name, documentation, labels=list(labels))
    for key, count in sorted(counts):
        family.add_metric(list(key), count)
    return family


def histogram_family(
    histogram: Histogram, name: str, documentation: str, labels: Sequence[str]
) -> Metric:
    """A :class:`~nvpair.observe.metrics.Histogram` as a family: cumulative buckets, sum, count."""
    family = HistogramMetricFamily(name, documentation, labels=list(labels))
    edges = [*(repr(float(b)) for b in histogram.bounds), "+Inf"]
    for key, (counts, [total]) in sorted(histogram.series.items()):
        cumulative, running = [], 0
        for edge, count in zip(edges, counts, strict=True):
            running += count
            cumulative.append((edge, running))
        family.add_metric(list(key), cumulative, total)
    return family


class LiveState:
    """What a scrape reads of the process as it is now (the gauges)."""

    def __init__(
        self,
        facades: Callable[[], Mapping[str, int | None]],
        discovery: Callable[[str], int],
        in_flight: Callable[[], Mapping[tuple[str, str], int]],
        reservations: Callable[[], Mapping[str, int]],
        requests_in_flight: Callable[[], int],
        nodes_up: Callable[[], Mapping[tuple[str, str], bool]] = dict,
        queue_depth: Callable[[], Mapping[tuple[str, str], int]] = dict,
    ) -> None:
        """
        :param facades: engine -> the port its facade listens on, for every facade that is
            enabled or should be (None: not listening).
        :param discovery: how many nodes an engine's discovery holds.
        :param in_flight: (engine, node) -> dispatches in flight (only those with some).
        :param reservations: node -> reservations held.
        :param requests_in_flight: admitted requests not yet ended.
        :param nodes_up: (engine, node) -> whether the node is up, for every configured node
            (fleet mode; empty in broker mode, where the broker keeps the fleet).
        :param queue_depth: (facade, model) -> requests waiting in fleet mode's queue.
        """
        self.facades = facades
        self.discovery = discovery
        self.in_flight = in_flight
        self.reservations = reservations
        self.requests_in_flight = requests_in_flight
        self.nodes_up = nodes_up
        self.queue_depth = queue_depth


class MetricsCollector(Collector):
    """Every family of ``/metrics``, read when scraped."""

    def __init__(self, metrics: Metrics, live: LiveState) -> None:
        self._metrics = metrics
        self._live = live

    def collect(self) -> Iterator[Metric]:
        m, live = self._metrics, self._live
        yield _counter(
            "nvpair_requests",
            "Requests ended, by engine, route class and outcome (served, the proxy's reason, "
            "or cancelled).",
            ["engine", "route", "outcome"],
            m.requests.items(),
        )
        yield _counter(
            "nvpair_key_requests",
            "Requests ended that came with a fleet key, by key name, engine and outcome.",
            ["key", "engine", "outcome"],
            m.keyed.items(),
        )
        yield _counter(
            "nvpair_attempts",
            "Dispatches to a node ended, by engine, node and result.",
            ["engine", "node", "result"],
            m.attempts.items(),
        )
        yield _counter(
            "nvpair_failovers",
            "Dispatches after a request's first, by engine.",
            ["engine"],
            [((engine,), count) for engine, count in m.failovers.items()],
        )
        yield histogram_family(
            m.first_byte,
            "nvpair_time_to_first_byte_seconds",
            "From admission to the first byte of the answer served, by engine.",
            ["engine"],
        )
        yield histogram_family(
            m.duration,
            "nvpair_request_duration_seconds",
            "From admission to the end of the request, by engine and route class.",
            ["engine", "route"],
        )
        yield _counter(
            "nvpair_tokens",
            "Tokens of served answers as their engine reported them (or estimated), by engine "
            "and kind.",
            ["engine", "kind"],
            m.tokens.items(),
        )
        yield _counter(
            "nvpair_cached_tokens",
            "Prompt tokens a node's engine reported reading from its cache, by the engine and "
            "node that answered.",
            ["engine", "node"],
            m.cached.items(),
        )
        yield _counter(
            "nvpair_affinity",
            "Requests by what the fleet's order did with their conversation at their first "
            "dispatch (followed, moved, new), by the engine and node dispatched to.",
            ["engine", "node", "result"],
            m.affinity.items(),
        )
        yield histogram_family(
            m.rate,
            "nvpair_tokens_per_second",
            "Decode rate of served answers, by engine.",
            ["engine"],
        )
        yield histogram_family(
            m.queue_wait,
            "nvpair_queue_wait_seconds",
            "How long each request that waited in the fleet's queue waited, served or not.",
            ("engine",),
        )
        depth = GaugeMetricFamily(
            "nvpair_queue_depth",
            "Requests waiting in the fleet's queue, by facade and model.",
            labels=["engine", "model"],
        )
        for (engine, model), count in sorted(live.queue_depth().items()):
            depth.add_metric([engine, model], count)
        yield depth
        in_flight = GaugeMetricFamily(
            "nvpair_in_flight",
            "This process's dispatches in flight, by engine and node.",
            labels=["engine", "node"],
        )
        for (engine, node), count in sorted(live.in_flight().items()):
            in_flight.add_metric([engine, node], count)
        yield in_flight
        reservations = GaugeMetricFamily(
            "nvpair_reservations", "Reservations held, by node.", labels=["node"]
        )
        for node, count in sorted(live.reservations().items()):
            if count:
                reservations.add_metric([node], count)
        yield reservations
        facades = live.facades()
        discovery = GaugeMetricFamily(
            "nvpair_discovery_nodes", "Nodes in each engine's discovery.", labels=["engine"]
        )
        up = GaugeMetricFamily(
            "nvpair_facade_up", "1 while the engine's facade listens.", labels=["engine"]
        )
        port = GaugeMetricFamily(
            "nvpair_facade_port", "The port each enabled facade listens on.", labels=["engine"]
        )
        # Per engine whose nodes a facade reaches: the openai facade's are its engines'.
        for engine in sorted(served_engines(facades)):
            discovery.add_metric([engine], live.discovery(engine))
        for engine, listening in sorted(facades.items()):
            up.add_metric([engine], 0 if listening is None else 1)
            if listening is not None:
                port.add_metric([engine], listening)
        yield discovery
        yield up
        yield port
        node_up = GaugeMetricFamily(
            "nvpair_node_up",
            "1 while a configured node is up; 0 when down, held back or not polled yet "
            "(fleet mode).",
            labels=["engine", "node"],
        )
        for (engine, node), is_up in sorted(live.nodes_up().items()):
            node_up.add_metric([engine, node], 1 if is_up else 0)
        yield node_up
        yield GaugeMetricFamily(
            "nvpair_requests_in_flight",
            "Admitted requests not yet ended.",
            value=live.requests_in_flight(),
        )
