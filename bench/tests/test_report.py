"""The report: profile summaries, the markdown table and the plot."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.profile import frame_label, parse, summarize
from bench.report import Run, console, load, markdown, plot, render, save

ROOT = "<module> (twistd:6);run (twisted/internet/base.py:90)"
COLLAPSED = "\n".join(
    [
        f"{ROOT};doRead (twisted/internet/tcp.py:10) 6",
        f"{ROOT};handle (nvpair/dispatch/requestpath.py:70);"
        "plan (nvpair/dispatch/candidates.py:30) 3",
        "<module> (twistd:6);handle (nvpair/dispatch/requestpath.py:70) 1",
        "not a stack line",
    ]
)


def test_frames_are_labelled_by_file_and_function() -> None:
    label = frame_label("plan (nvpair/dispatch/candidates.py:30)")
    assert label == "nvpair/dispatch/candidates.py:plan"
    long = "write (/work/main/.venv/lib/python3.11/site-packages/twisted/web/http.py:1)"
    assert frame_label(long) == "twisted/web/http.py:write"
    assert frame_label("odd") == "odd"


def test_malformed_lines_are_skipped() -> None:
    assert [count for _, count in parse(COLLAPSED)] == [6, 3, 1]


def test_summary_shares_own_and_inclusive_time() -> None:
    """Own time goes to the top frame; inclusive time counts a function once per stack."""
    text = summarize(COLLAPSED)
    assert "10 samples." in text
    assert " 60.0 % `twisted/internet/tcp.py:doRead`" in text
    assert " 40.0 % `nvpair/dispatch/requestpath.py:handle`" in text  # 3 + 1 of 10
    assert " 30.0 % `nvpair/dispatch/candidates.py:plan`" in text
    assert summarize("") == "(no samples)"


TABLE: dict[str, dict[str, list[float | None]]] = {
    "rps_c32": {"nvpair": [900.0, 1100.0], "floor": [1000.0, 1000.0], "litellm": [30.0, None]},
    "cpu_per_request_us": {"nvpair": [80.0, 90.0], "floor": [100.0, 100.0]},
    "latency_p50_ms": {"nvpair": [1.0, 1.2], "direct": [0.5, 0.5]},
    "route_us": {"2": [5.0, 5.0], "256": [15.0, 14.0]},
}


def test_markdown_has_every_target_with_a_verdict_and_the_side_by_side_table() -> None:
    text = markdown("title", ["header"], TABLE, ["a note"], "profile text")
    assert (
        "| proxy CPU per non-streamed request at c=32 <= 0.75x the floor's (issue 34's guard) "
        "| 0.85x | 0.80 / 0.90 | **MISS** |"
    ) in text
    assert "| LiteLLM still >= 30x behind nvpair (req/s at c=32) | 30.00x |" in text
    assert "**n/a**" in text  # the scenarios not run
    assert "| req/s at c=32 | — | 1,000 | 1,000 | — | 30 |" not in text  # no nginx column
    assert "| | direct | nvpair | floor | litellm |" in text
    assert "- a note" in text
    assert "profile text" in text


def test_the_cold_start_mix_has_its_own_side_by_side_table() -> None:
    table: dict[str, dict[str, list[float | None]]] = {
        **TABLE,
        "mix_ttft_p50_ms": {"default": [3.0, 2.0, 40.0], "warm-aware": [2.5, 2.0, 2.0]},
        "mix_cold_starts": {"default": [17.0, 18.0, 16.0], "warm-aware": [7.0, 7.0, 6.0]},
    }
    text = markdown("title", [], table, [], None)
    assert "| | default | warm-aware |" in text
    assert "| streamed: TTFT p50 (ms) | 3.0 | 2.0 |" in text
    assert "| cold starts (the nodes' loads) | 17 | 7 |" in text
    assert "failed requests" not in text  # not measured: no row
    assert "| cold-start mix: cold starts >= 3x fewer" in text
    assert "Cold-start mix" not in markdown("title", [], TABLE, [], None)


def test_console_prints_pass_and_miss() -> None:
    lines = console(TABLE).splitlines()
    assert any(line.startswith("  MISS  proxy CPU per non-streamed") for line in lines)
    assert any(line.startswith("  PASS  LiteLLM still") for line in lines)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    samples = {"c=1 latency (ms)": {"nvpair": [1.0, 1.2, 3.0], "floor": [0.9, 1.0]}}
    out = tmp_path / "plot.png"
    plot(samples, TABLE, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_saved_run_draws_the_same_table_again(tmp_path: Path) -> None:
    run = Run("t", ["h"], TABLE, {"x (ms)": {"nvpair": [1.0, 2.0]}}, ["n"], None)
    save(run, tmp_path / "run.json")
    again = load(tmp_path / "run.json")
    assert again == run
    md, _ = render(again, tmp_path / "run")
    assert md.read_text() == markdown("t", ["h"], TABLE, ["n"], None)


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        '{"table": [], "samples": {}, "header": [], "notes": []}',
        '{"table": {"m": {"a": ["1"]}}, "samples": {}, "header": [], "notes": []}',
        '{"table": {}, "samples": {"s": {"a": [null]}}, "header": [], "notes": []}',
        '{"table": {"m": {"a": [true]}}, "samples": {}, "header": [], "notes": []}',
        "not json",
    ],
)
def test_a_file_that_is_not_a_saved_run_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError):
        load(path)


def test_the_multiturn_table_shows_each_side_s_median_and_every_round() -> None:
    table: dict[str, dict[str, list[float | None]]] = {
        "mt_ttft_p50_ms": {"affinity-off": [900.0, 600.0], "affinity-on": [300.0, 150.0]},
        "mt_evaluated": {"affinity-off": [90_000.0, 80_000.0], "affinity-on": [30_000.0, None]},
        "mt_read_ms": {"calibration": [1234.0, None]},
    }
    text = markdown("title", [], table, [], None)
    assert "| | affinity-off | affinity-on |" in text  # no column for a run that did not happen
    assert "| TTFT p50 (ms) | 750 (900 / 600) | 225 (300 / 150) |" in text
    assert "| 85,000 (90,000 / 80,000) | 30,000 (30,000 / —) |" in text
    assert "Reading a 2,000-token history took 1,234 ms" in text
    assert "| multi-turn: TTFT p50 >= 1.5x lower with affinity (off / on) | 3.50x |" in text
    assert "Multi-turn" not in markdown("title", [], TABLE, [], None)
