"""The contention bench's pure parts (bench/contentionload.py): the workloads, the fleet and
key files, each part's figures from what the client saw, and the verdicts from the figures
(bench/targets.py), none of it run."""

from __future__ import annotations

import hashlib
import tomllib

import pytest

from bench.contentionload import (
    CALLERS,
    CHAT,
    CUT,
    FLOOD,
    HIGH,
    LOW,
    Collation,
    Fairness,
    LateBinding,
    Outcome,
    arrivals,
    capacity,
    chat_body,
    chat_times,
    collation_figures,
    fairness_figures,
    fleet_text,
    flood_lengths,
    keys_text,
    late_figures,
    mix_models,
    priority_figures,
    summarize,
)
from bench.report import markdown
from bench.targets import TARGETS, Table, Target, Verdict, judge


def answered(
    caller: str, sent: float, ttft: float, ended: float, queued: float | None = None
) -> Outcome:
    return Outcome(caller, sent, 200, ttft, ended, queued)


# -- the workloads ----------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_requests_and_another_seed_others() -> None:
    fair, late, mixed = Fairness(), LateBinding(), Collation()
    assert flood_lengths(31, fair, 3) == flood_lengths(31, fair, 3)
    assert flood_lengths(31, fair, 3) != flood_lengths(31, fair, 4)
    assert arrivals(31, late) == arrivals(31, late)
    assert arrivals(31, late) != arrivals(32, late)
    assert mix_models(31, mixed, 0) == mix_models(31, mixed, 0)
    assert mix_models(31, mixed, 0) != mix_models(32, mixed, 0)


def test_a_flood_worker_has_more_requests_than_it_can_send_and_each_about_two_seconds() -> None:
    shape = Fairness()
    lengths = flood_lengths(31, shape, 0)
    low, high = shape.flood_tokens
    assert all(low <= n <= high for n in lengths)
    # Every answer takes at least the shortest's time: never more than this many fit.
    assert len(lengths) * low * shape.token_seconds > shape.seconds
    assert shape.service == pytest.approx(2.04)


def test_chats_come_every_interval_after_the_idle_spell() -> None:
    assert chat_times(Fairness(seconds=10.0)) == (2.0, 4.0, 6.0, 8.0)
    spelled = chat_times(Fairness(seconds=6.0, idle=3.0, idle_every=1.0))
    assert spelled == (0.0, 1.0, 2.0, 5.0, 7.0)


def test_late_arrivals_come_at_the_share_of_capacity_asked() -> None:
    """Two fast nodes and one three times slower, two slots each: the capacity in answers a
    second, and arrivals over a long run at 85 % of it."""
    shape = LateBinding(seconds=2000.0)
    answer = (shape.mean_tokens + 2) * shape.token_seconds
    assert capacity(shape) == pytest.approx(4 / answer + 2 / (3 * answer))
    asks = arrivals(31, shape)
    assert len(asks) / shape.seconds == pytest.approx(0.85 * capacity(shape), rel=0.05)
    low, high = shape.tokens
    assert all(low <= a.tokens <= high for a in asks)
    assert [a.at for a in asks] == sorted(a.at for a in asks)
    mean = sum(a.tokens for a in asks) / len(asks)
    assert mean == pytest.approx(shape.mean_tokens, rel=0.05)


def test_the_collation_mix_asks_for_every_model() -> None:
    shape = Collation()
    drawn = [m for w in range(shape.workers) for m in mix_models(31, shape, w)]
    assert set(drawn) == set(shape.models)
    assert shape.bound == pytest.approx(shape.collate + 2 * shape.service)


# -- the fleet and the keys -------------------------------------------------------------------


def test_the_fleet_file_differs_only_in_the_queue_switch() -> None:
    nodes = [("n0", "http://127.0.0.1:1"), ("n1", "http://127.0.0.1:2")]
    on = tomllib.loads(fleet_text("llamacpp", 8080, nodes, True))
    off = tomllib.loads(fleet_text("llamacpp", 8080, nodes, False))
    assert on["queue"] == {"enabled": True} and off["queue"] == {"enabled": False}
    assert {k: v for k, v in on.items() if k != "queue"} == {
        k: v for k, v in off.items() if k != "queue"
    }
    # Callers are told apart by key: [access] is in force, on a network no caller is on.
    assert on["access"] == {"networks": ["192.0.2.0/24"], "keys": "keys.toml"}
    assert on["facades"] == {"llamacpp": {"port": 8080}}
    assert [n["engines"]["llamacpp"] for n in on["nodes"]] == [u for _, u in nodes]
    collated = tomllib.loads(fleet_text("ollama", 1, nodes, True, collate=10.0))
    assert collated["queue"] == {"enabled": True, "collate": "10s"}


def test_every_caller_has_a_key_with_its_priority() -> None:
    keys = tomllib.loads(keys_text())["keys"]
    assert [k["name"] for k in keys] == [c.name for c in CALLERS]
    for key, caller in zip(keys, CALLERS, strict=True):
        assert key["sha256"] == hashlib.sha256(caller.secret.encode()).hexdigest()
    priorities = {k["name"]: k["priority"] for k in keys}
    assert priorities[LOW.name] == "low" and priorities[HIGH.name] == "high"
    assert priorities[FLOOD.name] == priorities[CHAT.name] == "normal"


def test_a_chat_asks_for_its_tokens_and_a_real_engine_to_ignore_the_end_token() -> None:
    assert b'"ignore_eos"' not in chat_body("tiny", 5, "hi")
    assert b'"ignore_eos": true' in chat_body("mt", 5, "hi", real=True)
    assert b'"max_tokens": 5' in chat_body("tiny", 5, "hi")


# -- the figures ------------------------------------------------------------------------------


def test_a_request_cut_at_the_end_is_neither_completed_nor_failed() -> None:
    outcomes = [
        answered("flood", 0.0, 10.0, 2.0),
        answered("flood", 1.0, 10.0, 61.0),  # ended after the window
        Outcome("flood", 50.0, 200, 5.0, 62.0, error=CUT),
        Outcome("flood", 50.0, None, None, 62.0, error=CUT),
        Outcome("flood", 3.0, 503, None, 3.1, error="status 503: busy"),
    ]
    seen = summarize(outcomes, until=60.0)
    assert (seen.requests, seen.completed, seen.cut, seen.failed) == (5, 1, 2, 1)


def test_fairness_figures_are_the_chatter_s_ttft_and_the_flood_s_window() -> None:
    outcomes = [answered("chat", float(i), 100.0 * (i + 1), i + 1.0, 5.0) for i in range(20)]
    outcomes += [answered("flood", 0.0, 900.0, 2.0), answered("flood", 0.0, 900.0, 70.0)]
    outcomes.append(Outcome("chat", 30.0, None, None, 31.0, error="OSError: refused"))
    figures = fairness_figures(outcomes, FLOOD, CHAT, 60.0, "fair")
    assert figures["ct_fair_chat_p95_ms"] == 1900.0
    assert figures["ct_fair_chat_p50_ms"] == 1000.0
    assert figures["ct_fair_chat_waited"] == 20
    assert figures["ct_fair_flood_done"] == 1
    assert figures["ct_fair_failed"] == 1
    assert "ct_real_chat_p95_ms" in fairness_figures(outcomes, FLOOD, CHAT, 60.0, "real")


def test_priority_figures_split_the_idle_spell_from_the_flood() -> None:
    outcomes = [answered("boss", float(i), 20.0, i + 0.1) for i in range(10)]
    outcomes += [answered("boss", 10.0 + i, 300.0 + i, 11.0 + i) for i in range(20)]
    outcomes += [answered("batch", 10.0, 4000.0, 14.0)]
    figures = priority_figures(outcomes, 10.0, 70.0, Fairness(idle=10.0))
    assert figures["ct_prio_idle_p95_ms"] == 20.0
    assert figures["ct_prio_high_p95_ms"] == 318.0
    assert figures["ct_prio_service_ms"] == pytest.approx(2040.0)
    assert (figures["ct_prio_flood_done"], figures["ct_prio_failed"]) == (1, 0)


def test_collation_figures_count_no_wait_as_none_and_carry_the_bound() -> None:
    shape = Collation()
    quick = [answered("team", 0.0, 3000.0, 4.0)]
    figures = collation_figures(quick, 2, 0, shape)
    assert figures["ct_coll_queued_max_ms"] == 0.0
    assert figures["ct_coll_bound_ms"] == pytest.approx(shape.bound * 1000)
    waited = [*quick, answered("team", 1.0, 9000.0, 11.0, queued=6000.0)]
    figures = collation_figures(waited, 5, 3, shape)
    assert figures["ct_coll_queued_max_ms"] == 6000.0
    assert figures["ct_coll_ttft_max_ms"] == 9000.0
    assert (figures["ct_coll_loads"], figures["ct_coll_evictions"]) == (5, 3)


def test_late_figures_take_the_tail() -> None:
    outcomes = [answered("team", float(i), float(i + 1), i + 2.0) for i in range(100)]
    figures = late_figures(outcomes)
    assert figures["ct_late_p99_ms"] == 99.0 and figures["ct_late_p50_ms"] == 50.0
    assert (figures["ct_late_done"], figures["ct_late_failed"]) == (100, 0)


# -- the verdicts -----------------------------------------------------------------------------

CT = {t.name: t for t in TARGETS if t.name.startswith("contention")}


def target(words: str) -> Target:
    (found,) = [t for name, t in CT.items() if words in name]
    return found


def sides(**metrics: tuple[list[float | None], list[float | None]]) -> Table:
    return {m: {"queue-off": off, "queue-on": on} for m, (off, on) in metrics.items()}


def test_the_contention_targets_are_nine() -> None:
    assert len(CT) == 9


def test_fairness_is_judged_on_same_round_ratios() -> None:
    table = sides(
        ct_fair_chat_p95_ms=([8000.0, 7000.0, 6000.0], [900.0, 1000.0, 1500.0]),
        ct_fair_flood_done=([170.0, 170.0, 170.0], [168.0, 160.0, 165.0]),
        ct_fair_failed=([0.0, 0.0, 0.0], [0.0, 0.0, 0.0]),
    )
    ttft = judge(target("second caller's TTFT p95 >= 5x"), table)
    assert ttft.per_round == pytest.approx((8000 / 900, 7.0, 4.0))
    assert ttft.value == pytest.approx(7.0) and ttft.verdict is Verdict.PASS
    done = judge(target("completed requests >= 0.95x"), table)
    assert done.value == pytest.approx(165 / 170) and done.verdict is Verdict.PASS
    assert judge(target("nothing failed"), table).verdict is Verdict.PASS


def test_one_failed_request_in_one_round_of_either_side_is_a_miss() -> None:
    table = sides(ct_fair_failed=([0.0, 0.0, 1.0], [0.0, 0.0, 0.0]))
    judged = judge(target("nothing failed"), table)
    assert judged.value == 1 and judged.verdict is Verdict.MISS
    short = sides(ct_fair_flood_done=([100.0], [94.0]))
    assert judge(target("completed requests >= 0.95x"), short).verdict is Verdict.MISS


def test_late_binding_is_judged_on_the_tail_and_the_work_done() -> None:
    table = sides(
        ct_late_p99_ms=([9000.0, 6000.0, 8000.0], [4000.0, 5000.0, 4000.0]),
        ct_late_done=([200.0, 200.0, 200.0], [200.0, 195.0, 200.0]),
    )
    tail = judge(target("TTFT p99 >= 1.5x"), table)
    assert tail.value == pytest.approx(2.0) and tail.verdict is Verdict.PASS
    done = judge(target("late binding: completed"), table)
    assert done.value == pytest.approx(1.0) and done.verdict is Verdict.PASS
    slow = sides(ct_late_p99_ms=([6000.0], [5000.0]))
    assert judge(target("TTFT p99 >= 1.5x"), slow).verdict is Verdict.MISS


def test_collation_loads_fewer_and_the_longest_wait_in_every_round() -> None:
    table = sides(
        ct_coll_loads=([20.0, 16.0, 12.0], [8.0, 10.0, 0.0]),
        ct_coll_queued_max_ms=([0.0, 0.0, 0.0], [9000.0, 12500.0, 4000.0]),
        ct_coll_bound_ms=([12040.0] * 3, [12040.0] * 3),
    )
    loads = judge(target("model loads >= 2x fewer"), table)
    # A round with no load at all counts as one: a lower bound, not a round left out.
    assert loads.per_round == pytest.approx((2.5, 1.6, 12.0))
    assert loads.value == pytest.approx(2.5) and loads.verdict is Verdict.PASS
    wait = judge(target("no request waited longer"), table)
    assert wait.value == pytest.approx(12500 / 12040)
    assert wait.verdict is Verdict.MISS
    within = sides(
        ct_coll_queued_max_ms=([0.0], [12000.0]), ct_coll_bound_ms=([12040.0], [12040.0])
    )
    assert judge(target("no request waited longer"), within).verdict is Verdict.PASS


def test_priority_is_judged_against_the_idle_fleet_plus_one_service_time() -> None:
    """Read strictly: at most 1.5 times the idle p95, plus one service time."""
    table = sides(
        ct_prio_high_p95_ms=([7000.0], [2100.0]),
        ct_prio_idle_p95_ms=([30.0], [40.0]),
        ct_prio_service_ms=([2040.0], [2040.0]),
    )
    judged = judge(target("high key's TTFT p95"), table)
    assert judged.value == pytest.approx(2100 / (1.5 * 40 + 2040))
    assert judged.verdict is Verdict.PASS
    table["ct_prio_high_p95_ms"]["queue-on"] = [2200.0]  # type: ignore[index]
    assert judge(target("high key's TTFT p95"), table).verdict is Verdict.MISS


def test_the_real_engine_round_is_one_round_judged_alone() -> None:
    table = sides(ct_real_chat_p95_ms=([22000.0, None, None], [1000.0, None, None]))
    judged = judge(target("real engines"), table)
    assert judged.value == pytest.approx(22.0) and judged.verdict is Verdict.PASS
    assert judge(target("real engines"), {}).verdict is Verdict.NA


def test_the_report_has_the_contention_table_with_every_round() -> None:
    table = sides(ct_fair_chat_p95_ms=([8000.0, 7000.0], [900.0, 1000.0]))
    text = markdown("t", [], table, [], None)
    assert "## Contention: the fleet's queue off against on" in text
    assert "| fairness: the second caller's TTFT p95 (ms) | 7,500 (8,000 / 7,000) |" in text
    # No proxy-against-proxy figure was measured: no empty table for them.
    assert "## Side by side" not in text
