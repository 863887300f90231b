"""The table as markdown (and on the console) and the latency distributions as a PNG.

Rendering only: the figures come from :class:`bench.scenarios.Results` and the verdicts from
:mod:`bench.targets`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from bench.targets import TARGETS, Judged, Table, Verdict, judge, median

CONTENDERS = ("direct", "nvpair", "nvpair+metrics", "floor", "nginx", "litellm")
FAULT_KINDS = ("refused", "503", "reset", "stall")

#: (row label, metric, decimals) of the side-by-side table, medians over rounds.
ROWS: tuple[tuple[str, str, int], ...] = (
    ("c=1 latency p50 (ms)", "latency_p50_ms", 2),
    ("c=1 latency p99 (ms)", "latency_p99_ms", 2),
    ("req/s at c=32", "rps_c32", 0),
    ("CPU per request (us)", "cpu_per_request_us", 0),
    ("CPU per request, A-B-B-A with and without /metrics (us)", "metrics_cpu_us", 0),
    ("user-space instructions per request (k, c=1)", "instructions_k", 0),
    ("64-chunk streams/s at c=32", "streams_c32", 0),
    ("CPU per 64-chunk stream (us)", "cpu_per_stream_us", 0),
    ("held: broken streams", "held_broken", 0),
    ("held: TTFB p50 (ms)", "held_ttfb_p50_ms", 1),
    ("held: TTFB p99 (ms)", "held_ttfb_p99_ms", 1),
    ("held: worst gap p99 (s)", "held_gap_p99_s", 3),
    ("held: RSS before the streams (MB)", "held_rss_start_mb", 1),
    ("held: peak RSS (MB)", "held_rss_mb", 1),
    ("failover: healthy TTFB p50 (ms)", "failover_base_ms", 2),
    *((f"failover: {kind} TTFB p50 (ms)", f"failover_ttfb_ms:{kind}", 2) for kind in FAULT_KINDS),
    *((f"failover: {kind} adds (ms)", f"failover_added_ms:{kind}", 2) for kind in FAULT_KINDS),
    *((f"failover: {kind}, share that met it", f"failover_met:{kind}", 2) for kind in FAULT_KINDS),
)
#: The cold-start mix: nvpair's two candidate orders, side by side.
MIX_SIDES = ("default", "warm-aware")
MIX_ROWS: tuple[tuple[str, str, int], ...] = (
    ("requests", "mix_requests", 0),
    ("failed requests", "mix_failed", 0),
    ("streamed: TTFT p50 (ms)", "mix_ttft_p50_ms", 1),
    ("streamed: TTFT p99 (ms)", "mix_ttft_p99_ms", 0),
    ("streamed: waited for a load (> 250 ms)", "mix_waited", 0),
    ("non-streamed: answer p50 (ms)", "mix_answer_p50_ms", 0),
    ("cold starts (the nodes' loads)", "mix_cold_starts", 0),
    ("evictions (loads that unloaded another model)", "mix_evictions", 0),
)
#: The multi-turn bench: affinity off and on, and the correction run (one node uncached).
MT_SIDES = ("affinity-off", "affinity-on", "no-cache-node")
MT_ROWS: tuple[tuple[str, str, int], ...] = (
    ("requests", "mt_requests", 0),
    ("failed requests", "mt_failed", 0),
    ("TTFT p50 (ms)", "mt_ttft_p50_ms", 0),
    ("TTFT p90 (ms)", "mt_ttft_p90_ms", 0),
    ("prompt tokens evaluated (the answers' timings.prompt_n)", "mt_evaluated", 0),
    ("prompt tokens from cache (timings.cache_n)", "mt_cached", 0),
    ("least any order evaluates (each conversation's last prompt, once)", "mt_least", 0),
    ("prompt tokens evaluated (the engines' /metrics)", "mt_engine_evaluated", 0),
    ("prompt tokens from cache (the engines' /metrics)", "mt_engine_cached", 0),
    ("busiest node's requests / a fair share", "mt_busiest_share", 2),
    ("share of follow-up turns on the turn before's node", "mt_stayed", 2),
    ("requests in flight, mean (6 slots)", "mt_in_flight", 2),
    *(
        (f"requests answered by {node}", f"mt_node_requests:{node}", 0)
        for node in ("n0", "n1", "n2")
    ),
)
#: The multi-turn bench's shared-prefix part: every conversation opens with one long system
#: prompt.
MTS_ROWS: tuple[tuple[str, str, int], ...] = (
    ("requests", "mts_requests", 0),
    ("failed requests", "mts_failed", 0),
    ("TTFT p50 (ms)", "mts_ttft_p50_ms", 0),
    ("TTFT p90 (ms)", "mts_ttft_p90_ms", 0),
    ("prompt tokens evaluated (the answers' timings.prompt_n)", "mts_evaluated", 0),
    ("prompt tokens from cache (timings.cache_n)", "mts_cached", 0),
    ("busiest node's requests / a fair share", "mts_busiest_share", 2),
    ("share of follow-up turns on the turn before's node", "mts_stayed", 2),
)
#: The contention bench: the fleet's queue off and on, part by part.
CT_SIDES = ("queue-off", "queue-on")
CT_ROWS: tuple[tuple[str, str, int], ...] = (
    ("fairness: the second caller's TTFT p50 (ms)", "ct_fair_chat_p50_ms", 0),
    ("fairness: the second caller's TTFT p95 (ms)", "ct_fair_chat_p95_ms", 0),
    ("fairness: the first caller's completed requests", "ct_fair_flood_done", 0),
    ("fairness: the first caller's TTFT p50 (ms)", "ct_fair_flood_p50_ms", 0),
    ("fairness: failed requests", "ct_fair_failed", 0),
    ("fairness: engine places busy (share)", "ct_fair_busy", 2),
    ("fairness: most requests waiting in one engine", "ct_fair_engine_waiting", 0),
    ("late binding: requests", "ct_late_requests", 0),
    ("late binding: TTFT mean (ms)", "ct_late_mean_ms", 0),
    ("late binding: TTFT p50 (ms)", "ct_late_p50_ms", 0),
    ("late binding: TTFT p99 (ms)", "ct_late_p99_ms", 0),
    ("late binding: completed requests", "ct_late_done", 0),
    ("late binding: failed requests", "ct_late_failed", 0),
    ("late binding: engine places busy (share)", "ct_late_busy", 2),
    ("late binding: most requests waiting in one engine", "ct_late_engine_waiting", 0),
    ("collation: model loads", "ct_coll_loads", 0),
    ("collation: evictions", "ct_coll_evictions", 0),
    ("collation: completed requests", "ct_coll_done", 0),
    ("collation: failed requests", "ct_coll_failed", 0),
    ("collation: TTFT p50 (ms)", "ct_coll_ttft_p50_ms", 0),
    ("collation: TTFT p99 (ms)", "ct_coll_ttft_p99_ms", 0),
    ("collation: TTFT max (ms)", "ct_coll_ttft_max_ms", 0),
    ("collation: longest wait in the queue (ms)", "ct_coll_queued_max_ms", 0),
    ("collation: collate + two service times (ms)", "ct_coll_bound_ms", 0),
    ("priority: the high key's TTFT p95 on the idle fleet (ms)", "ct_prio_idle_p95_ms", 0),
    ("priority: the high key's TTFT p95 beside the low flood (ms)", "ct_prio_high_p95_ms", 0),
    ("priority: the low flood's completed requests", "ct_prio_flood_done", 0),
    ("priority: failed requests", "ct_prio_failed", 0),
    ("real engines: the second caller's TTFT p50 (ms)", "ct_real_chat_p50_ms", 0),
    ("real engines: the second caller's TTFT p95 (ms)", "ct_real_chat_p95_ms", 0),
    ("real engines: the first caller's completed requests", "ct_real_flood_done", 0),
    ("real engines: failed requests", "ct_real_failed", 0),
    ("real engines: slots busy (share)", "ct_real_busy", 2),
)
#: One colour per contender in every panel.
COLOURS = {
    "direct": "tab:gray",
    "nvpair": "tab:blue",
    "nvpair+metrics": "tab:olive",
    "floor": "tab:green",
    "nginx": "tab:red",
    "litellm": "tab:purple",
    "default": "tab:orange",
    "warm-aware": "tab:cyan",
    "affinity-off": "tab:brown",
    "affinity-on": "tab:pink",
    "no-cache-node": "tab:gray",
    "queue-off": "tab:red",
    "queue-on": "tab:green",
}


def fmt(value: float | None, decimals: int = 2) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:,.{decimals}f}"


def fmt_judged(judged: Judged) -> str:
    unit = judged.target.unit
    return f"{fmt(judged.value)}{unit}" if unit in ("x", "%") else f"{fmt(judged.value)} {unit}"


def verdicts(table: Table) -> list[Judged]:
    return [judge(target, table) for target in TARGETS]


def markdown(
    title: str,
    header: Sequence[str],
    table: Table,
    notes: Sequence[str],
    profile: str | None,
) -> str:
    out = [f"# {title}", "", *header, ""]
    out += ["## Targets (nvpair; median of same-round figures)", ""]
    out += ["| target | measured | per round | verdict |", "|---|---|---|---|"]
    for judged in verdicts(table):
        rounds = " / ".join(fmt(v) for v in judged.per_round) or "—"
        out.append(
            f"| {judged.target.name} | {fmt_judged(judged)} | {rounds} | "
            f"**{judged.verdict.value}** |"
        )
    present = [c for c in CONTENDERS if any(c in table.get(m, {}) for _, m, _ in ROWS)]
    if present:
        out += ["", "## Side by side (median over rounds)", ""]
        out += ["| | " + " | ".join(present) + " |", "|---" * (len(present) + 1) + "|"]
    for label, metric, decimals in ROWS if present else ():
        if metric not in table:
            continue
        cells = [fmt(median(table[metric].get(c, ())), decimals) for c in present]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out += _mix_table(table)
    out += _multiturn_table(table)
    out += _sides_table(table, "Contention: the fleet's queue off against on", CT_SIDES, CT_ROWS)
    costs = table.get("route_us", {})
    if costs:
        sizes = sorted(costs, key=int)
        out += ["", "## Routing cost per request (us, in-process, 10,000 models)", ""]
        out += ["| nodes | " + " | ".join(sizes) + " |", "|---" * (len(sizes) + 1) + "|"]
        out.append("| us | " + " | ".join(fmt(median(costs[s])) for s in sizes) + " |")
    if notes:
        out += ["", "## Notes", "", *(f"- {note}" for note in notes)]
    if profile:
        out += ["", "## Profile: nvpair under c=32 non-streaming (py-spy)", "", profile]
    return "\n".join(out) + "\n"


def _mix_table(table: Table) -> list[str]:
    """The cold-start mix's rows: nvpair in broker mode with no scheduler (the default
    order) beside nvpair in fleet mode (warm-aware order)."""
    rows = [(label, metric, d) for label, metric, d in MIX_ROWS if metric in table]
    if not rows:
        return []
    out = ["", "## Cold-start mix: default order against warm-aware order (median over rounds)"]
    out += ["", "| | " + " | ".join(MIX_SIDES) + " |", "|---" * (len(MIX_SIDES) + 1) + "|"]
    for label, metric, decimals in rows:
        cells = [fmt(median(table[metric].get(side, ())), decimals) for side in MIX_SIDES]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out


def _multiturn_table(table: Table) -> list[str]:
    """The multi-turn bench's rows, each the median over rounds and every round's figure."""
    title = "Multi-turn: affinity off against affinity on"
    out = _sides_table(table, title, MT_SIDES, MT_ROWS)
    shared = "Multi-turn, one shared 2,000-token system prompt: affinity off against on"
    out += _sides_table(table, shared, MT_SIDES, MTS_ROWS)
    read = table.get("mt_read_ms", {}).get("calibration", ())
    if out and read and read[0] is not None:
        out += [
            "",
            f"Reading a 2,000-token history took {fmt(read[0], 0)} ms (one thread, no cache).",
        ]
    return out


def _sides_table(
    table: Table,
    title: str,
    sides: Sequence[str],
    rows: Sequence[tuple[str, str, int]],
) -> list[str]:
    """One scenario's sides in columns, each row the median over rounds and every round's
    figure; nothing when it did not run."""
    present = [(label, metric, d) for label, metric, d in rows if metric in table]
    if not present:
        return []
    shown = [side for side in sides if any(side in table[m] for _, m, _ in present)]
    out = ["", f"## {title} (median over rounds; per round)"]
    out += ["", "| | " + " | ".join(shown) + " |", "|---" * (len(shown) + 1) + "|"]
    for label, metric, decimals in present:
        cells = []
        for side in shown:
            values = table[metric].get(side, ())
            per_round = " / ".join(fmt(v, decimals) for v in values)
            cells.append(f"{fmt(median(values), decimals)} ({per_round})")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out


def console(table: Table) -> str:
    lines = []
    for judged in verdicts(table):
        mark = {Verdict.PASS: "PASS", Verdict.MISS: "MISS", Verdict.NA: "n/a "}[judged.verdict]
        lines.append(f"  {mark}  {judged.target.name}: {fmt_judged(judged)}")
    return "\n".join(lines)


def plot(samples: Mapping[str, Mapping[str, Sequence[float]]], table: Table, path: Path) -> None:
    """CDFs of every sampled distribution, one panel each, and the routing cost curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    panels = [name for name, by in samples.items() if any(by.values())]
    costs = table.get("route_us", {})
    count = len(panels) + (1 if costs else 0)
    if not count:
        return
    columns = 2 if count > 1 else 1
    rows = math.ceil(count / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6.5 * columns, 4.2 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, name in zip(flat, panels, strict=False):
        for contender, values in samples[name].items():
            if not values:
                continue
            ordered = sorted(values)
            ys = [(i + 1) / len(ordered) for i in range(len(ordered))]
            label = f"{contender} (n={len(ordered)})"
            ax.step(ordered, ys, where="post", label=label, color=COLOURS.get(contender))
        low = min(min(v) for v in samples[name].values() if v)
        high = max(max(v) for v in samples[name].values() if v)
        if low > 0 and high / low > 20:
            ax.set_xscale("log")
            # Plain numbers (0.5, 1, 2, 5 ...), not 2x10^0.
            ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_title(name)
        ax.set_xlabel(name.rsplit("(", 1)[-1].rstrip(")") if "(" in name else "")
        ax.set_ylabel("fraction of requests")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    if costs:
        ax = flat[len(panels)]
        sizes = sorted(costs, key=int)
        ys = [median(costs[s]) or float("nan") for s in sizes]
        ax.plot([int(s) for s in sizes], ys, marker="o", color=COLOURS["nvpair"])
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_title("nvpair routing cost per request (10,000 models)")
        ax.set_xlabel("nodes")
        ax.set_ylabel("us per request")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    for ax in flat[count:]:
        ax.set_visible(False)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


@attrs.frozen
class Run:
    """Everything one run measured, as saved next to its table (``<timestamp>.json``), so the
    table and the plot can be drawn again (``python -m bench --replot FILE``)."""

    title: str
    header: list[str]
    table: dict[str, dict[str, list[float | None]]]
    samples: dict[str, dict[str, list[float]]]
    notes: list[str]
    profile: str | None = None


def save(run: Run, path: Path) -> None:
    path.write_text(json.dumps(attrs.asdict(run), allow_nan=True))


def load(path: Path) -> Run:
    """A saved run; ValueError when the file is not one."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a saved run")
    table = {
        str(metric): {
            str(c): [_number(v) for v in _list(values)] for c, values in _dict(by).items()
        }
        for metric, by in _dict(data.get("table")).items()
    }
    samples = {
        str(name): {str(c): [_sample(v) for v in _list(vs)] for c, vs in _dict(by).items()}
        for name, by in _dict(data.get("samples")).items()
    }
    profile = data.get("profile")
    return Run(
        str(data.get("title", "")),
        [str(line) for line in _list(data.get("header"))],
        table,
        samples,
        [str(note) for note in _list(data.get("notes"))],
        profile if isinstance(profile, str) else None,
    )


def _dict(value: object) -> dict[object, object]:
    if not isinstance(value, dict):
        raise ValueError("a saved run's table and samples are objects")
    return value


def _list(value: object) -> list[object]:
    if not isinstance(value, list):
        raise ValueError("a saved run's rounds, samples, header and notes are lists")
    return value


def _number(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"not a number: {value!r}")


def _sample(value: object) -> float:
    number = _number(value)
    if number is None:
        raise ValueError("a sample is a number")
    return number


def render(run: Run, stem: Path) -> tuple[Path, Path | None]:
    """``<stem>.md`` and, when matplotlib is there, ``<stem>.png``."""
    md = stem.with_suffix(".md")
    md.write_text(markdown(run.title, run.header, run.table, run.notes, run.profile))
    png = stem.with_suffix(".png")
    try:
        plot(run.samples, run.table, png)
    except ImportError:
        return md, None
    return md, png
