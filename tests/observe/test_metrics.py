# -*- test-case-name: tests.observe.test_metrics -*-
"""The admin ``/metrics`` families (:mod:`nvpair.observe.metrics`): counted on the request path as
plain arithmetic, read and written by prometheus-client only when scraped."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nvpair.dispatch.attempt import Failed, Fault, Served
from nvpair.engines.inferstats import Stats
from nvpair.observe.exposition import LiveState, MetricsCollector
from nvpair.observe.metrics import LATENCY_BUCKETS, Metrics

Labels = tuple[tuple[str, str], ...]


def scrape(metrics: Metrics, live: LiveState | None = None) -> dict[str, dict[Labels, float]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        MetricsCollector(
            metrics,
            live
            or LiveState(
                facades=lambda: {"ollama": 11435, "llamacpp": None},
                discovery=lambda engine: {"ollama": 2}.get(engine, 0),
                in_flight=lambda: {("ollama", "a"): 3},
                reservations=lambda: {"a": 1, "b": 0},
                requests_in_flight=lambda: 4,
                nodes_up=lambda: {("ollama", "a"): True, ("ollama", "b"): False},
            ),
        )
    )
    text = generate_latest(registry).decode()
    out: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def labels(**values: str) -> Labels:
    return tuple(sorted(values.items()))


def test_requests_attempts_and_failovers_by_their_labels() -> None:
    m = Metrics()
    m.attempt_ended("ollama", "a", Failed(Fault.STATUS, status=503))
    m.attempt_ended("ollama", "a", Failed(Fault.TRANSPORT))
    m.attempt_ended("ollama", "b", Served(object(), object()))  # type: ignore[arg-type]
    m.attempt_ended("ollama", "c", Failed(Fault.FIRST_BODY_TIMEOUT))
    m.attempt_ended("ollama", "c", Failed(Fault.NODE_LEFT))
    m.request_ended("ollama", "inference", "served", 3, 1.5, 0.2)
    m.request_ended("ollama", "inference", "no-owner", 0, 0.001, None)
    m.request_ended("ollama", "inventory", "served", 1, 0.01, 0.01)
    got = scrape(m)
    assert got["nvpair_requests_total"] == {
        labels(engine="ollama", route="inference", outcome="served"): 1,
        labels(engine="ollama", route="inference", outcome="no-owner"): 1,
        labels(engine="ollama", route="inventory", outcome="served"): 1,
    }
    assert got["nvpair_attempts_total"] == {
        labels(engine="ollama", node="a", result="status"): 1,
        labels(engine="ollama", node="a", result="transport"): 1,
        labels(engine="ollama", node="b", result="served"): 1,
        labels(engine="ollama", node="c", result="first_body_timeout"): 1,
        labels(engine="ollama", node="c", result="node_left"): 1,
    }
    assert got["nvpair_failovers_total"] == {labels(engine="ollama"): 2}


def test_histograms_are_cumulative_with_sum_and_count() -> None:
    m = Metrics()
    for seconds in (0.003, 0.2, 0.2, 400.0):
        m.request_ended("llamacpp", "inference", "served", 1, seconds, seconds)
    got = scrape(m)
    buckets = got["nvpair_time_to_first_byte_seconds_bucket"]
    assert buckets[labels(engine="llamacpp", le="0.005")] == 1
    assert buckets[labels(engine="llamacpp", le="0.1")] == 1
    assert buckets[labels(engine="llamacpp", le="0.25")] == 3
    assert buckets[labels(engine="llamacpp", le="300.0")] == 3
    assert buckets[labels(engine="llamacpp", le="+Inf")] == 4
    assert len(buckets) == len(LATENCY_BUCKETS) + 1
    assert got["nvpair_time_to_first_byte_seconds_count"] == {labels(engine="llamacpp"): 4}
    assert got["nvpair_time_to_first_byte_seconds_sum"][labels(engine="llamacpp")] == 400.403
    duration = got["nvpair_request_duration_seconds_count"]
    assert duration == {labels(engine="llamacpp", route="inference"): 4}


def test_tokens_and_rates_from_the_workload_stats() -> None:
    m = Metrics()
    for stats in (
        Stats(12, 30, 42.5, 100, False),
        Stats(None, 5, None, 100, True),
        Stats(0, 0, None, None, False),
    ):
        m.request_ended("ollama", "inference", "served", 1, 0.5, 0.1, stats)
    got = scrape(m)
    assert got["nvpair_tokens_total"] == {
        labels(engine="ollama", kind="prompt"): 12,
        labels(engine="ollama", kind="completion"): 35,
    }
    assert got["nvpair_tokens_per_second_count"] == {labels(engine="ollama"): 1}
    assert got["nvpair_tokens_per_second_bucket"][labels(engine="ollama", le="50.0")] == 1


def test_prompt_tokens_read_from_cache_are_counted_as_cached() -> None:
    """docs/fleet-scheduling.md#what-the-operator-sees"""
    m = Metrics()
    m.request_ended(
        "llamacpp", "inference", "served", 1, 0.5, 0.1, Stats(179, 4, None, 9, False, 112)
    )
    m.request_ended("llamacpp", "inference", "served", 1, 0.5, 0.1, Stats(20, 4, None, 9, False, 0))
    m.request_ended("ollama", "inference", "served", 1, 0.5, 0.1, Stats(20, 4, None, 9, False))
    got = scrape(m)["nvpair_tokens_total"]
    assert got[labels(engine="llamacpp", kind="cached")] == 112
    assert got[labels(engine="llamacpp", kind="prompt")] == 199
    assert labels(engine="ollama", kind="cached") not in got


def test_gauges_read_the_live_state_when_scraped() -> None:
    got = scrape(Metrics())
    assert got["nvpair_in_flight"] == {labels(engine="ollama", node="a"): 3}
    assert got["nvpair_reservations"] == {labels(node="a"): 1}
    assert got["nvpair_discovery_nodes"] == {
        labels(engine="ollama"): 2,
        labels(engine="llamacpp"): 0,
    }
    assert got["nvpair_facade_up"] == {labels(engine="ollama"): 1, labels(engine="llamacpp"): 0}
    assert got["nvpair_facade_port"] == {labels(engine="ollama"): 11435}
    assert got["nvpair_requests_in_flight"] == {(): 4}
    assert got["nvpair_node_up"] == {
        labels(engine="ollama", node="a"): 1,
        labels(engine="ollama", node="b"): 0,
    }


def test_requests_with_a_fleet_key_are_counted_by_key() -> None:
    """``nvpair_key_requests_total{key,engine,outcome}`` (docs/lan.md#keys)."""
    metrics = Metrics()
    metrics.key_request_ended("laptop", "ollama", "served")
    metrics.key_request_ended("laptop", "ollama", "served")
    metrics.key_request_ended("phone", "ollama", "forbidden-model")
    assert scrape(metrics)["nvpair_key_requests_total"] == {
        labels(key="laptop", engine="ollama", outcome="served"): 2,
        labels(key="phone", engine="ollama", outcome="forbidden-model"): 1,
    }


def test_a_refusal_before_the_request_path_counts_as_a_request_and_in_no_histogram() -> None:
    """docs/operations.md#metrics: every refusal is in ``nvpair_requests_total`` under its
    reason, the head's too; it took no time worth a latency bucket."""
    metrics = Metrics()
    metrics.request_refused("ollama", "inventory", "unauthorized")
    metrics.request_refused("ollama", "inventory", "unauthorized")
    metrics.request_refused("ollama", "other", "tls-required")
    assert scrape(metrics)["nvpair_requests_total"] == {
        labels(engine="ollama", route="inventory", outcome="unauthorized"): 2,
        labels(engine="ollama", route="other", outcome="tls-required"): 1,
    }
    assert metrics.duration.series == {} and metrics.first_byte.series == {}
