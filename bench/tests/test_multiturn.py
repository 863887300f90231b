"""The multi-turn bench's pure parts: a side's summary, its table, the verdicts, the fleet file,
and the cached model."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from bench.chatresults import NodeTokens, Turn, side_table, summarize
from bench.llamanodes import LlamaNode, model_path
from bench.multiturn import NODES, affinity_shown, fleet_text
from bench.targets import TARGETS, Verdict, both_sides_failed, judge
from tests.real.tiny_gguf import Shape


def served(
    node: str, prompt_n: int, cache_n: int, ttft: float = 100.0, at: tuple[int, int] = (0, 0)
) -> Turn:
    return Turn(*at, 200, node, ttft, prompt_n, cache_n)


def test_a_side_sums_the_engines_own_counts_per_node_and_over_the_side() -> None:
    turns = [
        served("n0", 300, 0, 120.0, at=(0, 0)),
        served("n0", 280, 310, 90.0, at=(0, 1)),
        served("n1", 900, 0, 600.0, at=(2, 0)),
        Turn(1, 0, 503, "", None, None, None, "status 503: busy"),
        Turn(1, 1, None, "", None, None, None, "not sent"),
    ]
    side = summarize(turns, NODES)
    assert (side.requests, side.failed) == (5, 2)
    assert side.statuses == {"200": 3, "503": 1, "none": 1}
    assert (side.evaluated, side.cached) == (1480, 310)
    assert side.nodes == {
        "n0": NodeTokens(2, 580, 310),
        "n1": NodeTokens(1, 900, 0),
        "n2": NodeTokens(0, 0, 0),
    }
    assert side.ttft_p50_ms == 120.0 and side.ttft_p90_ms == 600.0
    # Each conversation's longest prompt (280 + 310, and 900): had one node kept each, it would
    # have read no more (earlier turns are prefixes); conversation 1 was never answered.
    assert side.least == 590 + 900
    # Two of three answers on one of three nodes: twice a fair share.
    assert side.busiest_share == pytest.approx(2.0)


def test_follow_ups_on_the_node_before_and_the_requests_in_flight() -> None:
    """Stickiness counts answered turns after an answered one; the mean in flight is the
    turns' summed time over the run's."""
    turns = [
        Turn(0, 0, 200, "n0", 10.0, 1, 0, seconds=2.0),
        Turn(0, 1, 200, "n0", 10.0, 1, 0, seconds=2.0),
        Turn(0, 2, 200, "n1", 10.0, 1, 0, seconds=2.0),
        Turn(1, 0, 503, "", None, None, None, "status 503", seconds=1.0),
        Turn(1, 1, 200, "n1", 10.0, 1, 0, seconds=3.0),
    ]
    side = summarize(turns, NODES, elapsed=5.0)
    assert (side.followups, side.stayed) == (2, 1)
    assert side.in_flight == pytest.approx(2.0)
    assert summarize(turns, NODES).in_flight is None


def test_what_status_says_of_affinity() -> None:
    assert affinity_shown({"affinity": {"enabled": True, "slack": 2}}) is True
    assert affinity_shown({"affinity": {"enabled": False}}) is False
    assert affinity_shown({"mode": "fleet"}) is None
    assert affinity_shown([1]) is None
    assert affinity_shown({"affinity": {"enabled": "yes"}}) is None


def test_failed_turns_count_for_no_node_and_no_tokens() -> None:
    """An answer that did not end well (no [DONE], no timings) is a failure, not a figure."""
    turns = [Turn(0, 0, 200, "n0", 50.0, 10, 0, "the stream ended without [DONE]")]
    side = summarize(turns, NODES)
    assert side.failed == 1 and side.evaluated == 0
    assert side.ttft_p50_ms is None and side.busiest_share is None


def test_a_node_share_of_cache() -> None:
    assert NodeTokens(3, 100, 300).cache_share == 0.75
    assert NodeTokens().cache_share is None


def test_the_round_table_has_a_column_per_side_and_a_row_per_node() -> None:
    sides = {
        "affinity-off": summarize([served("n0", 900, 0), served("n2", 800, 100)], NODES),
        "affinity-on": summarize([served("n1", 300, 600)], NODES),
    }
    lines = side_table(sides)
    assert "affinity-off" in lines[0] and "affinity-on" in lines[0]
    body = "\n".join(lines)
    assert "TTFT p50 / p90 (ms)" in body and "1,700" in body
    assert any(line.startswith("n2: answers, evaluated, cached") for line in lines)
    assert len({len(line) for line in lines}) == 1  # aligned columns


MT_TARGETS = {
    t.name.split(": ", 1)[1].split(" >=")[0].split(" <=")[0]: t
    for t in TARGETS
    if t.name.startswith("multi-turn: ")
}


def table(**by_side: dict[str, list[float | None]]) -> dict[str, dict[str, list[float | None]]]:
    out: dict[str, dict[str, list[float | None]]] = {}
    for side, metrics in by_side.items():
        for metric, values in metrics.items():
            out.setdefault(metric, {})[side.replace("_", "-")] = values
    return out


def test_the_multiturn_verdicts_are_same_round_ratios_and_worst_rounds() -> None:
    figures = table(
        affinity_off={
            "mt_ttft_p50_ms": [900.0, 600.0, 300.0],
            "mt_evaluated": [90_000.0, 80_000.0, 70_000.0],
            "mt_busiest_share": [1.3, 1.2, 1.1],
            "mt_failed": [0.0, 0.0, 0.0],
        },
        affinity_on={
            "mt_ttft_p50_ms": [200.0, 200.0, 200.0],
            "mt_evaluated": [30_000.0, 40_000.0, 10_000.0],
            "mt_busiest_share": [1.2, 1.6, 1.1],
            "mt_failed": [0.0, 1.0, 0.0],
            "mt_least": [25_000.0, 25_000.0, 9_000.0],
            "mt_stayed": [0.95, 0.85, 0.92],
        },
    )
    judged = {name: judge(t, figures) for name, t in MT_TARGETS.items()}
    ttft = judged["TTFT p50"]
    assert ttft.per_round == (4.5, 3.0, 1.5) and ttft.verdict is Verdict.PASS  # median 3.0
    tokens = judged["prompt tokens the engines evaluated"]
    assert tokens.per_round == (3.0, 2.0, 7.0) and tokens.value == 3.0
    least = judged["prompt tokens the engines evaluated with affinity"]
    assert least.per_round == pytest.approx((1.2, 1.6, 10 / 9)) and least.value == 1.2
    stayed = judged["follow-ups on the node of the turn before"]
    assert stayed.value == 92 and stayed.verdict is Verdict.PASS
    busiest = judged["busiest node's requests"]
    assert busiest.value == 1.6 and busiest.verdict is Verdict.MISS  # one round piled up
    answered = judged["every request answered 200 on both sides (failed, worst round)"]
    assert answered.value == 1 and answered.verdict is Verdict.MISS


def test_every_request_answered_needs_both_sides_of_the_round() -> None:
    only_one = table(affinity_on={"mt_failed": [0.0]})
    assert both_sides_failed(only_one) == []
    both = table(affinity_off={"mt_failed": [2.0, None]}, affinity_on={"mt_failed": [0.0, 0.0]})
    assert both_sides_failed(both) == [2.0, None]


NODE_LIST = [LlamaNode(name, 9000 + i, 1) for i, name in enumerate(NODES)]


def test_the_fleet_file_names_the_nodes_and_the_side_s_affinity() -> None:
    for affinity in (True, False):
        parsed = tomllib.loads(fleet_text(4321, NODE_LIST, affinity))
        assert parsed["facades"] == {"llamacpp": {"port": 4321}}
        assert parsed["scheduling"] == {"affinity": affinity}
        assert [n["id"] for n in parsed["nodes"]] == list(NODES)
        assert parsed["nodes"][2]["engines"] == {"llamacpp": "http://127.0.0.1:9002"}


def test_the_fleet_file_is_one_the_proxy_takes(tmp_path: Path) -> None:
    """Read by the proxy's own parser: the side's switch is what the order gets."""
    from nvpair.fleet.file import load_fleet

    for affinity in (True, False):
        path = tmp_path / f"fleet-{affinity}.toml"
        path.write_text(fleet_text(4321, NODE_LIST, affinity))
        fleet = load_fleet(path, {})
        assert [n.id for n in fleet.nodes] == list(NODES)
        assert fleet.affinity.enabled is affinity


def test_the_model_is_written_once_into_the_cache_and_reused(tmp_path: Path) -> None:
    environ = {"XDG_CACHE_HOME": str(tmp_path)}
    shape = Shape(embed=32, ffn=64, blocks=1, heads=2, context=128)
    first = model_path(shape, environ)
    assert first.parent == tmp_path / "nvpair" and first.stat().st_size > 0
    written = first.stat().st_mtime_ns
    assert model_path(shape, environ) == first
    assert first.stat().st_mtime_ns == written
    # Nothing half-written is left beside it.
    assert sorted(p.suffix for p in first.parent.iterdir()) == [".gguf", ".lock"]


def test_a_shape_the_attention_cannot_split_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        model_path(
            Shape(embed=30, ffn=64, blocks=1, heads=4, context=128),
            {"XDG_CACHE_HOME": str(tmp_path)},
        )
    assert not list((tmp_path / "nvpair").glob("*.gguf"))
