"""Judging: same-round ratios, medians, and the PASS/MISS/n/a verdicts."""

from __future__ import annotations

import pytest

from bench.targets import (
    TARGETS,
    Table,
    Target,
    Verdict,
    busiest_either,
    counters_off_by,
    differences,
    flatness,
    judge,
    median,
    over_least,
    percentile,
    ratios,
    rounds,
    worst,
)


def test_percentile_is_nearest_rank() -> None:
    """p50 of 1..10 is 5 and p99 is the largest: no interpolation between samples."""
    values = [float(v) for v in range(10, 0, -1)]
    assert percentile(values, 50) == 5
    assert percentile(values, 99) == 10
    assert percentile(values, 0) == 1
    assert percentile([3.0], 99) == 3


def test_percentile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)


def test_ratios_pair_values_of_the_same_round() -> None:
    """Round i of one contender is only ever divided by round i of the other."""
    table: Table = {"rps": {"nvpair": [300.0, None, 100.0], "floor": [100.0, 50.0, 0.0]}}
    assert ratios(table, "rps", "nvpair", "floor") == [3.0, None, None]
    assert differences(table, "rps", "nvpair", "floor") == [200.0, None, 100.0]


def test_median_skips_missing_and_non_finite_rounds() -> None:
    assert median([1.0, None, 3.0, float("nan")]) == 2.0
    assert median([None]) is None
    assert worst([1.0, None, 4.0]) == 4.0


def test_verdicts_follow_the_bound_and_its_direction() -> None:
    """At least: PASS at or above the bound; at most: PASS at or below; no data: n/a."""
    table = {"m": {"a": [1.5, 1.4, 2.0]}}
    at_least = Target("m", lambda t: rounds(t, "m", "a"), 1.5, False, "x")
    at_most = Target("m", lambda t: rounds(t, "m", "a"), 1.4, True, "x")
    assert judge(at_least, table).verdict is Verdict.PASS  # median 1.5
    assert judge(at_most, table).verdict is Verdict.MISS
    assert judge(at_least, {}).verdict is Verdict.NA


def test_a_promise_for_every_round_is_judged_on_the_worst() -> None:
    """One round with a broken held stream is a MISS even when the median round had none."""
    target = next(t for t in TARGETS if "intact" in t.name)
    table = {"held_broken": {"nvpair": [0.0, 2.0, 0.0]}}
    judged = judge(target, table)
    assert judged.value == 2
    assert judged.verdict is Verdict.MISS


def test_flatness_is_the_largest_departure_from_two_nodes() -> None:
    """Per round, every size is compared with that round's 2-node cost."""
    table: Table = {"route_us": {"2": [10.0, 5.0], "16": [11.0, 5.0], "256": [13.0, None]}}
    assert flatness(table) == pytest.approx([30.0, 0.0])


def test_metrics_cost_is_judged_on_same_round_ratios() -> None:
    """Counting for /metrics: nvpair with an admin listener against nvpair without, the same
    requests, the same round; 3 % over is a MISS."""
    cpu = next(t for t in TARGETS if "CPU per request" in t.name and "/metrics" in t.name)
    table: Table = {"metrics_cpu_us": {"nvpair": [200.0, 210.0], "nvpair+metrics": [204.0, 222.0]}}
    assert judge(cpu, table).value == pytest.approx((1.02 + 222 / 210) / 2)
    assert judge(cpu, table).verdict is Verdict.MISS
    counted = next(t for t in TARGETS if "instructions" in t.name)
    assert (
        judge(counted, {"instructions_k": {"nvpair": [984.0], "nvpair+metrics": [1009.0]}}).verdict
        is Verdict.PASS
    )


def test_every_issue_target_is_judged() -> None:
    """The table has the issues' thirty-two lines, each with a verdict even on no data."""
    assert len(TARGETS) == 32
    assert all(judge(t, {}).verdict is Verdict.NA for t in TARGETS)


def test_the_cold_start_mix_is_judged_as_default_over_warm_aware() -> None:
    """ "3x fewer" twice: the default order's figure over the warm-aware one's, per round, at
    least the bound. The waits replaced the p50, which both orders serve warm (bench/README.md
    "The verdicts are the workload's"); no target judges a median any more."""
    waited, cold = (t for t in TARGETS if t.name.startswith("cold-start mix"))
    assert "waited for a load" in waited.name and "cold starts" in cold.name
    assert not any("p50" in t.name for t in TARGETS if t.name.startswith("cold-start mix"))
    table: Table = {
        "mix_ttft_p50_ms": {"default": [3.5, 3.0, 3.3], "warm-aware": [2.7, 3.0, 2.9]},
        "mix_waited": {"default": [46.0, 29.0, 35.0], "warm-aware": [5.0, 7.0, 0.0]},
        "mix_cold_starts": {"default": [17.0, 18.0, 20.0], "warm-aware": [7.0, 6.0, 7.0]},
    }
    judged = judge(waited, table)
    # No wait at all counts as one: "at least 35x fewer", not a round left out.
    assert judged.per_round == pytest.approx((9.2, 29 / 7, 35.0))
    assert judged.value == pytest.approx(9.2)
    assert judged.verdict is Verdict.PASS
    judged = judge(cold, table)
    assert judged.value == pytest.approx(20 / 7)  # the median of 17/7, 3 and 20/7
    assert judged.verdict is Verdict.MISS


def test_added_latency_is_judged_against_nginx_in_the_same_round() -> None:
    """Each side's p50 over the direct path's of the same round; 2x nginx's is the bound."""
    target = next(t for t in TARGETS if "nginx's added latency" in t.name)
    table: Table = {
        "latency_p50_ms": {
            "direct": [0.30, 0.50, 0.40],
            "nvpair": [0.70, 0.80, 0.60],
            "nginx": [0.50, 0.60, 0.40],
        }
    }
    judged = judge(target, table)
    assert judged.per_round == pytest.approx((2.0, 3.0, None))  # nginx added nothing: no ratio
    assert judged.value == pytest.approx(2.5)
    assert judged.verdict is Verdict.MISS


def test_throughput_is_reported_not_judged() -> None:
    assert not any("req/s" in t.name and "LiteLLM" not in t.name for t in TARGETS)
    assert not any("streams/s" in t.name for t in TARGETS)


def test_multiturn_judged_against_the_least_any_order_could_evaluate() -> None:
    """Issue 33's multi-turn figures: evaluated over the least, the larger busiest share of the
    two sides, and the engines' counters against their answers' sums, per round."""
    table: dict[str, dict[str, list[float | None]]] = {
        "mt_evaluated": {"affinity-off": [200.0, 180.0], "affinity-on": [120.0, 100.0]},
        "mt_least": {"affinity-on": [100.0, 0.0]},
        "mt_busiest_share": {"affinity-off": [1.2, 1.1], "affinity-on": [1.0, 1.6]},
        "mt_cached": {"affinity-off": [10.0, 10.0], "affinity-on": [50.0, 60.0]},
        "mt_engine_evaluated": {"affinity-off": [200.0, 180.0], "affinity-on": [120.0, 103.0]},
        "mt_engine_cached": {"affinity-off": [10.0, 10.0], "affinity-on": [50.0, None]},
    }
    assert over_least(table) == [1.2, None]
    assert busiest_either(table) == [1.2, 1.6]
    assert counters_off_by(table) == [0.0, None]
    by_name = {t.name: t for t in TARGETS}
    least = next(t for name, t in by_name.items() if "the least any order" in name)
    assert judge(least, table).verdict is Verdict.PASS
    counters = next(t for name, t in by_name.items() if "/metrics counters" in name)
    table["mt_engine_cached"]["affinity-on"] = [50.0, 59.0]
    assert judge(counters, table).value == 3.0
    assert judge(counters, table).verdict is Verdict.MISS


def test_issue_34s_guard_is_judged_against_the_floor_of_the_same_round() -> None:
    """Added latency over the floor's added latency, and peak RSS over the floor's."""
    added = next(t for t in TARGETS if "the floor's added latency" in t.name)
    table = {"latency_p50_ms": {"nvpair": [0.6, 0.9], "floor": [0.8, 1.0], "direct": [0.4, 0.5]}}
    # 0.2 / 0.4 = 0.5 and 0.4 / 0.5 = 0.8: the median 0.65 misses 0.6.
    assert judge(added, table).verdict is Verdict.MISS
    table["latency_p50_ms"]["nvpair"] = [0.5, 0.7]
    assert judge(added, table).verdict is Verdict.PASS
    rss = next(t for t in TARGETS if "peak RSS" in t.name)
    assert judge(rss, {"held_rss_mb": {"nvpair": [88.0], "floor": [69.0]}}).verdict is Verdict.PASS
    assert judge(rss, {"held_rss_mb": {"nvpair": [92.0], "floor": [69.0]}}).verdict is Verdict.MISS
