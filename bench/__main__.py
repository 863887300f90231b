"""``make bench``: the performance table of nvpair-proxy, beside the floor, nginx and LiteLLM.

Every contender fronts the same simulated llama.cpp nodes (processes of their own) on loopback:
the simulated engine itself (**direct**), **nvpair** (``twistd -n nvpair-proxy``, standalone fleet
mode), the **floor** (:mod:`bench.floor`, a minimal Twisted proxy), **nginx** and **LiteLLM**.
Scenarios (bench/README.md): latency at c=1 and req/s at c=32 (non-streaming), 64-chunk
streams/s at c=32 with the proxy's CPU per stream, held streams (2,000 opened at 500/s, 60
chunks 1 s apart), failover by fault kind, the routing cost against fleet size, and the
cold-start mix (nvpair's warm-aware fleet order against the default order, in front of
four simulated Ollama nodes that load models on demand: bench/coldstart.py), and the multi-turn
bench (seeded conversations through fleet mode with prefix affinity on and off, in front of
three real llama-servers: bench/multiturn.py), and the contention bench (the fleet's queue on
and off under a flood, late binding, collation and priority: bench/contention.py). Each runs in
rounds with the contenders taking turns; every target is judged on same-round figures and
printed PASS/MISS. The table goes to bench/results/<timestamp>.md, the latency distributions to
<timestamp>.png, every figure to <timestamp>.json. A contender that is not installed is reported
as skipped, never dropped. Nothing leaves loopback.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import subprocess
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import attrs

from bench import load, profile, report, scenarios
from bench.contenders import Setup, nginx_binary, node, nvpair, ready
from bench.contentionload import PARTS
from bench.procs import ROOT
from bench.scenarios import SCENARIOS, Plan, Results

RESULTS = ROOT / "bench" / "results"


def _git(*argv: str) -> str:
    # Read-only: --no-optional-locks keeps `status` from refreshing the index.
    done = subprocess.run(
        ["git", "--no-optional-locks", *argv], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip()


def _commit() -> str:
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    changed = _git("status", "--porcelain", "--untracked-files=no")
    return commit + (" (+ uncommitted changes)" if changed else "")


def _header(plan: Plan, chosen: list[str], first: str) -> list[str]:
    # Each proxy process runs the tree as it is when it starts: a run that spans a commit says so.
    last = _commit()
    commit = first if first == last else f"{first} at the start, {last} at the end"
    return [
        f"commit {commit}; {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"nginx {'present' if nginx_binary() else 'absent'}, wrk "
        f"{'present' if load.wrk_available() else 'absent'}; every process shares the cores "
        "with the simulated engines and the load generator.",
        "",
        f"{plan.rounds} round(s), contenders alternating within each. c=1: {plan.requests} "
        f"sequential requests; c={plan.connections}: wrk for {plan.seconds:g} s; held: "
        f"{plan.held_streams} streams at {plan.held_rate:g}/s, {plan.held_chunks} chunks "
        f"{plan.held_interval:g} s apart; failover: {plan.failovers} requests per fault kind "
        f"({plan.stalls} for the stall, first-byte timeout {plan.stall_timeout:g} s where the "
        f"proxy has one); cold-start mix: {plan.coldstart_seconds:g} s of arrivals per order "
        f"(seed {plan.coldstart_seed} + round, popularity exponent {plan.coldstart_zipf:g}, "
        f"{plan.coldstart_room} models in memory per node); multi-turn: "
        f"{plan.multiturn_conversations} conversations (seed {plan.multiturn_seed} + round)"
        f"{', and the correction run' if plan.multiturn_correction else ''}; contention: "
        f"{plan.contention_seconds:g} s per part and side (seed {plan.contention_seed} + round; "
        f"{', '.join(plan.contention_parts)}). "
        f"Scenarios: {', '.join(chosen)}.",
    ]


def _non_negative(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number >= 0")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number > 0")
    return value


def _parts(text: str) -> tuple[str, ...]:
    parts = tuple(part for part in text.split(",") if part)
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(PARTS)}, not {text!r}")
    return parts


def _profile(plan: Plan, work: Path, out: Path) -> str | None:
    """nvpair under wrk c=32 (non-streaming) with py-spy attached; the summary, or None."""
    if not profile.available():
        print("  profile skipped: py-spy is not installed (make bench-tools)", flush=True)
        return None
    print(f"profile: nvpair under wrk c={plan.connections}, py-spy attached", flush=True)
    sub = work / "profile"
    sub.mkdir()
    seconds = max(plan.seconds, 5)
    with node() as a, node() as b, nvpair(Setup((a, b)), sub) as running:
        ready(running.port, 60)
        errors: list[Exception] = []

        def sample() -> None:
            try:
                profile.record(running.pid, seconds - 1, out)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
                errors.append(error)

        sampler = threading.Thread(target=sample)
        sampler.start()
        time.sleep(0.5)
        load.wrk(running.port, seconds, plan.connections, sub, stream=False)
        sampler.join()
    if errors:
        print(f"  profile failed: {errors[0]}", flush=True)
        return None
    return profile.summarize(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short round of everything")
    parser.add_argument("--rounds", type=int, help="rounds per scenario (default 3)")
    parser.add_argument("--requests", type=int, help="sequential requests at c=1")
    parser.add_argument("--seconds", type=float, help="seconds of each wrk run")
    parser.add_argument("--connections", type=int, help="wrk concurrency (default 32)")
    parser.add_argument("--failovers", type=int, help="requests per failover fault kind")
    parser.add_argument(
        "--only",
        help=f"comma-separated scenarios to run, of {','.join(SCENARIOS)} (default all)",
    )
    parser.add_argument(
        "--coldstart-zipf",
        type=_non_negative,
        help="cold-start mix: popularity exponent of the models (default 1; 0: all alike)",
    )
    parser.add_argument(
        "--coldstart-room",
        type=_positive_int,
        help="cold-start mix: models each node holds in memory at once (default 2)",
    )
    parser.add_argument(
        "--multiturn-conversations",
        type=_positive_int,
        help="multi-turn bench: conversations per side (default 24)",
    )
    parser.add_argument(
        "--multiturn-correction",
        action="store_true",
        help="multi-turn bench: also run affinity with one node's prompt cache off (not judged)",
    )
    parser.add_argument(
        "--multiturn-no-shared",
        action="store_true",
        help="multi-turn bench: skip the shared-prefix part",
    )
    parser.add_argument(
        "--contention-seconds",
        type=_positive_float,
        help="contention bench: seconds each part runs per side (default 60; --quick 20)",
    )
    parser.add_argument(
        "--contention-parts",
        type=_parts,
        help=f"contention bench: comma-separated parts of {','.join(PARTS)} (default all)",
    )
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy profile")
    parser.add_argument(
        "--replot", type=Path, metavar="JSON", help="draw a saved run's table and plot again"
    )
    args = parser.parse_args()
    if args.replot is not None:
        try:
            run = report.load(args.replot)
        except (OSError, ValueError) as error:
            parser.error(f"--replot: {error}")
        md, png = report.render(run, args.replot.with_suffix(""))
        print(f"{report.console(run.table)}\n\ntable: {md}" + (f", plot: {png}" if png else ""))
        return

    plan = Plan.quick() if args.quick else Plan()
    overrides = {
        name: getattr(args, name)
        for name in (
            "rounds",
            "requests",
            "seconds",
            "connections",
            "failovers",
            "coldstart_zipf",
            "coldstart_room",
            "multiturn_conversations",
            "contention_seconds",
            "contention_parts",
        )
        if getattr(args, name) is not None
    }
    if args.multiturn_correction:
        overrides["multiturn_correction"] = True
    if args.multiturn_no_shared:
        overrides["multiturn_shared"] = False
    plan = attrs.evolve(plan, **overrides)
    chosen = args.only.split(",") if args.only else list(SCENARIOS)
    unknown = set(chosen) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    RESULTS.mkdir(exist_ok=True)
    results = Results(plan.rounds)
    started = time.monotonic()
    first = _commit()
    profiled: str | None = None
    with tempfile.TemporaryDirectory(prefix="nvpair-bench-") as tmp:
        work = Path(tmp)
        for scenario in chosen:
            scenarios.RUNNERS[scenario](plan, results, work, scenarios.contenders_for(scenario))
        if not args.no_profile and "non-streaming" in chosen:
            profiled = _profile(plan, work, RESULTS / f"{stamp}-profile.txt")

    title = f"make bench, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    run = report.Run(
        title, _header(plan, chosen, first), results.table, results.samples, results.notes, profiled
    )
    stem = RESULTS / stamp
    report.save(run, stem.with_suffix(".json"))
    md, png = report.render(run, stem)
    if png is None:
        print("  no plot: matplotlib is not installed (make bench installs it)", flush=True)
    print(f"\n{report.console(results.table)}\n")
    print(f"table: {md.relative_to(ROOT)}", end="")
    print(f", plot: {png.relative_to(ROOT)}" if png is not None else "")
    print(f"({(time.monotonic() - started) / 60:.1f} min)")


if __name__ == "__main__":
    main()
