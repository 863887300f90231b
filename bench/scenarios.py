"""The scenarios of the performance table, each in rounds with the contenders taking turns.

Every scenario fills :class:`Results`: per-round figures (``table[metric][contender][round]``,
what :mod:`bench.targets` judges) and pooled samples for the plot. A contender that cannot run
here (not installed) or fails is noted and its figures stay empty; the run goes on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path

import attrs

from bench import coldstart as mix_run
from bench import contention, contentionload, held, load, multiturn
from bench.contenders import (
    CONTENDERS,
    FRAMING_EVENTS,
    Node,
    Running,
    Setup,
    Skip,
    node,
    ready,
)
from bench.mixload import (
    LOAD_DELAY,
    MAX_LOADED,
    Mix,
    Request,
    offered_concurrency,
    summarize,
    workload,
)
from bench.procs import (
    cpu_seconds,
    listen_overflows,
    peak_rss_mb,
    refused_connects,
    rss_mb,
    wait_until,
)
from bench.targets import percentile


@attrs.frozen
class Plan:
    """How much of everything one run measures (``--quick`` shrinks it)."""

    rounds: int = 3
    requests: int = 500
    seconds: float = 10
    connections: int = 32
    stream_tokens: int = 60
    held_streams: int = 2000
    held_rate: float = 500
    held_chunks: int = 60
    held_interval: float = 1.0
    failovers: int = 200
    stalls: int = 20
    stall_timeout: float = 0.5
    route_sizes: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 128, 256)
    route_models: int = 10_000
    route_requests: int = 20_000
    coldstart_seconds: float = 80.0
    coldstart_seed: int = 13
    #: Popularity exponent of the mix's models (0: every model alike).
    coldstart_zipf: float = 1.0
    #: Models each node holds in memory at once.
    coldstart_room: int = MAX_LOADED
    multiturn_seed: int = 23
    multiturn_conversations: int = 24
    #: Also run affinity with one node's prompt cache off (bench/multiturn.py), not judged.
    multiturn_correction: bool = False
    #: Also play the conversations behind one shared 2,000-token system prompt (not judged).
    multiturn_shared: bool = True
    #: Seconds each part of the contention bench runs per side (bench/contention.py).
    contention_seconds: float = 60.0
    contention_seed: int = 31
    #: The parts of the contention bench to run (bench/contentionload.py).
    contention_parts: tuple[str, ...] = contentionload.PARTS

    @staticmethod
    def quick() -> Plan:
        return Plan(
            rounds=1,
            requests=100,
            seconds=3,
            held_streams=200,
            held_chunks=10,
            failovers=30,
            stalls=5,
            route_requests=2_000,
            coldstart_seconds=20.0,
            contention_seconds=20.0,
        )


@attrs.define
class Results:
    rounds: int
    table: dict[str, dict[str, list[float | None]]] = attrs.field(factory=dict)
    samples: dict[str, dict[str, list[float]]] = attrs.field(factory=dict)
    notes: list[str] = attrs.field(factory=list)

    def put(self, metric: str, contender: str, round_index: int, value: float | None) -> None:
        values = self.table.setdefault(metric, {}).setdefault(contender, [None] * self.rounds)
        values[round_index] = value

    def sample(self, name: str, contender: str, values: Sequence[float]) -> None:
        self.samples.setdefault(name, {}).setdefault(contender, []).extend(values)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
            print(f"  note: {text}", flush=True)


def _say(text: str) -> None:
    print(text, flush=True)


@contextmanager
def _contender(
    results: Results, name: str, setup: Setup, work: Path, scenario: str
) -> Iterator[Running | None]:
    """The contender running, or None (noted) when it cannot run here."""
    sub = work / f"{scenario}-{name}-{time.monotonic_ns()}"
    sub.mkdir()
    try:
        with CONTENDERS[name](setup, sub) as running:
            yield running
    except Skip as why:
        results.note(f"{name}: skipped ({why})")
        yield None


def _guarded(results: Results, what: str, step: Callable[[], None]) -> None:
    try:
        step()
    except (RuntimeError, OSError) as error:
        results.note(f"{what} failed: {error}")


# -- non-streaming: latency at c=1, req/s at c=32 --------------------------------------------


def non_streaming(plan: Plan, results: Results, work: Path, names: Sequence[str]) -> None:
    _say("non-streaming: latency at c=1, req/s at c=32")
    with node() as a, node() as b:
        for r in range(plan.rounds):
            for name in names:
                step = partial(_non_streaming, plan, results, work, name, r, (a, b))
                _guarded(results, f"non-streaming {name}", step)


def _non_streaming(
    plan: Plan, results: Results, work: Path, name: str, r: int, nodes: tuple[Node, ...]
) -> None:
    with _contender(results, name, Setup(nodes), work, "plain") as running:
        if running is None:
            return
        ready(running.port, 180)
        samples = load.latency(running.port, plan.requests)
        results.sample("c=1 latency (ms)", name, samples)
        results.put("latency_p50_ms", name, r, percentile(samples, 50))
        results.put("latency_p99_ms", name, r, percentile(samples, 99))
        before = cpu_seconds(running.pid)
        run = load.wrk(running.port, plan.seconds, plan.connections, work, stream=False)
        used = cpu_seconds(running.pid) - before
        results.put("rps_c32", name, r, run.rate)
        if name != "direct" and run.requests:
            results.put("cpu_per_request_us", name, r, used / run.requests * 1e6)
        if run.errors:
            results.note(f"{name}: wrk saw {run.errors} errors or non-2xx at c={plan.connections}")
        _say(
            f"  round {r + 1} {name}: c=1 p50 {percentile(samples, 50):.2f} ms, "
            f"c={plan.connections} {run.rate:,.0f} req/s"
        )


# -- streaming: streams/s at c=32 and CPU per stream -------------------------------------------


def streaming(plan: Plan, results: Results, work: Path, names: Sequence[str]) -> None:
    chunks = plan.stream_tokens + FRAMING_EVENTS
    _say(f"streaming: {chunks}-chunk streams/s at c={plan.connections}, CPU per stream")
    with node(tokens=plan.stream_tokens) as a, node(tokens=plan.stream_tokens) as b:
        for r in range(plan.rounds):
            for name in names:
                step = partial(_streaming, plan, results, work, name, r, (a, b))
                _guarded(results, f"streaming {name}", step)


def _streaming(
    plan: Plan, results: Results, work: Path, name: str, r: int, nodes: tuple[Node, ...]
) -> None:
    with _contender(results, name, Setup(nodes), work, "stream") as running:
        if running is None:
            return
        ready(running.port, 180)
        before = cpu_seconds(running.pid)
        run = load.wrk(running.port, plan.seconds, plan.connections, work, stream=True)
        used = cpu_seconds(running.pid) - before
        results.put("streams_c32", name, r, run.rate)
        if name != "direct" and run.requests:
            results.put("cpu_per_stream_us", name, r, used / run.requests * 1e6)
        if run.errors:
            results.note(f"{name}: {run.errors} streams failed at c={plan.connections}")
        cpu = f", {used / run.requests * 1e6:,.0f} us CPU/stream" if name != "direct" else ""
        _say(f"  round {r + 1} {name}: {run.rate:,.0f} streams/s{cpu}")


# -- held streams ------------------------------------------------------------------------------


def held_streams(plan: Plan, results: Results, work: Path, names: Sequence[str]) -> None:
    tokens = plan.held_chunks - FRAMING_EVENTS
    _say(
        f"held streams: {plan.held_streams} opened at {plan.held_rate:.0f}/s, "
        f"{plan.held_chunks} chunks {plan.held_interval:g} s apart"
    )
    # A place for every stream on each node: held streams measure the proxies, not an engine's
    # queue (the simulated engines have had llama.cpp's four slots since issue 30).
    places = plan.held_streams
    with (
        node(tokens=tokens, interval=plan.held_interval, parallel=places) as a,
        node(tokens=tokens, interval=plan.held_interval, parallel=places) as b,
    ):
        for r in range(plan.rounds):
            for name in names:
                step = partial(_held, plan, results, work, name, r, (a, b))
                _guarded(results, f"held streams {name}", step)


def _held(
    plan: Plan, results: Results, work: Path, name: str, r: int, nodes: tuple[Node, ...]
) -> None:
    # A fresh process per run: VmHWM is the peak of this run alone.
    with _contender(results, name, Setup(nodes), work, "held") as running:
        if running is None:
            return
        ready(running.port, 180)
        if name != "direct":
            results.put("held_rss_start_mb", name, r, rss_mb(running.pid))
        ports = [n.port for n in nodes] if name == "direct" else [running.port]
        overflows = listen_overflows()
        timeout = plan.held_chunks * plan.held_interval + 60
        streams = held.run_held(ports, plan.held_streams, plan.held_rate, plan.held_chunks, timeout)
        dropped = listen_overflows() - overflows
        rss = peak_rss_mb(running.pid) if name != "direct" else None
    broken = [s for s in streams if not s.intact]
    ttfbs = [s.ttfb * 1000 for s in streams if s.ttfb is not None]
    gaps = [s.worst_gap for s in streams if s.worst_gap is not None]
    results.put("held_broken", name, r, len(broken))
    results.put("held_rss_mb", name, r, rss)
    if ttfbs:
        results.sample("held streams TTFB (ms)", name, ttfbs)
        results.put("held_ttfb_p50_ms", name, r, percentile(ttfbs, 50))
        results.put("held_ttfb_p99_ms", name, r, percentile(ttfbs, 99))
    if gaps:
        results.put("held_gap_p99_s", name, r, percentile(gaps, 99))
    if broken:
        kinds = sorted({s.error for s in broken})
        results.note(f"{name}: {len(broken)} held streams broken ({'; '.join(kinds[:3])})")
    if dropped:
        results.note(f"held streams {name}: the kernel dropped {dropped} SYNs at a full backlog")
    _say(
        f"  round {r + 1} {name}: {len(streams) - len(broken)}/{len(streams)} intact, TTFB p99 "
        f"{percentile(ttfbs, 99) if ttfbs else float('nan'):.0f} ms, gap p99 "
        f"{percentile(gaps, 99) if gaps else float('nan'):.3f} s"
        + (f", peak RSS {rss:.0f} MB" if rss is not None else "")
    )


# -- failover by fault kind ---------------------------------------------------------------------

FAULTS = ("refused", "503", "reset", "stall")
#: Untimed requests first: pools filled, code paths warm.
WARMUP = 3


def failover(plan: Plan, results: Results, work: Path, names: Sequence[str]) -> None:
    _say("failover: time to the first byte from the healthy node, by the first node's fault")
    with ExitStack() as stack:
        healthy = stack.enter_context(node())
        spare = stack.enter_context(node())
        bad = {k: stack.enter_context(node(fault=k)) for k in ("503", "reset", "stall")}
        for r in range(plan.rounds):
            for name in names:
                base = partial(_baseline, plan, results, work, name, r, (healthy, spare))
                _guarded(results, f"failover {name} baseline", base)
                for kind in FAULTS:
                    step = partial(_failover, plan, results, work, name, r, kind, bad, healthy)
                    _guarded(results, f"failover {name} {kind}", step)


def _baseline(
    plan: Plan, results: Results, work: Path, name: str, r: int, nodes: tuple[Node, ...]
) -> None:
    with _contender(results, name, Setup(nodes, ordered=True), work, "fo-base") as running:
        if running is None:
            return
        ready(running.port, 180)
        for _ in range(WARMUP):
            load.first_byte(running.port, 10)
        samples = [load.first_byte(running.port, 10) for _ in range(plan.failovers)]
    got = [s for s in samples if s is not None]
    if len(got) < len(samples):
        results.note(f"{name}: {len(samples) - len(got)} baseline TTFB samples failed")
    if got:
        results.put("failover_base_ms", name, r, percentile(got, 50))
        _say(f"  round {r + 1} {name} healthy: TTFB p50 {percentile(got, 50):.2f} ms")


def _failover(
    plan: Plan,
    results: Results,
    work: Path,
    name: str,
    r: int,
    kind: str,
    bad: dict[str, Node],
    healthy: Node,
) -> None:
    count = plan.stalls if kind == "stall" else plan.failovers
    timeout = plan.stall_timeout if kind == "stall" else None
    with ExitStack() as stack:
        # Refused: serving until the proxy has polled it, then gone, so the port refuses.
        first = stack.enter_context(node()) if kind == "refused" else bad[kind]
        polled = [n.counts()[1] for n in (first, healthy)]
        setup = Setup((first, healthy), ordered=True, first_byte_timeout=timeout)
        running = stack.enter_context(_contender(results, name, setup, work, f"fo-{kind}"))
        if running is None:
            return
        if running.polls:
            # Both nodes in discovery before the first sample (the polls are independent).
            wait_until(partial(_polled, (first, healthy), polled), 30, f"{name}'s first polls")
            time.sleep(0.3)
        for _ in range(WARMUP):
            load.first_byte(running.port, 5 if kind != "stall" else 1)
        if kind == "refused":
            _stop_node(first)
            time.sleep(0.2)
        samples, met = _sample_failovers(running.port, first, kind, count)
    got = [s for s, m in zip(samples, met, strict=True) if s is not None and m]
    label = f"{kind}"
    if not got:
        results.note(f"{name}: no failover on {kind} (no first byte within 5 s)")
        _say(f"  round {r + 1} {name} {kind}: no first byte")
        return
    p50 = percentile(got, 50)
    results.put(f"failover_ttfb_ms:{label}", name, r, p50)
    results.sample(f"failover TTFB, {kind} (ms)", name, got)
    base = results.table.get("failover_base_ms", {}).get(name, [None] * plan.rounds)[r]
    if base is not None:
        results.put(f"failover_added_ms:{label}", name, r, p50 - base)
    results.put(f"failover_met:{label}", name, r, sum(met) / len(met))
    if sum(met) < len(met):
        results.note(
            f"{name}: on {kind}, {len(met) - sum(met)} of {len(met)} requests skipped the "
            "faulty node (held back?) and are not counted as failovers"
        )
    failed = sum(1 for s in samples if s is None)
    if failed:
        results.note(f"{name}: on {kind}, {failed} of {len(samples)} requests got no first byte")
    _say(f"  round {r + 1} {name} {kind}: TTFB p50 {p50:.2f} ms over {len(got)} failovers")


def _polled(nodes: Sequence[Node], before: Sequence[int]) -> bool:
    return all(n.counts()[1] > seen for n, seen in zip(nodes, before, strict=True))


def _stop_node(target: Node) -> None:
    os.kill(target.pid, signal.SIGTERM)
    wait_until(lambda: not _alive(target.pid), 10, "the refused node to exit")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _sample_failovers(
    port: int, first: Node, kind: str, count: int
) -> tuple[list[float | None], list[bool]]:
    """TTFB samples, and per sample whether the faulty node saw the request: its own count,
    or for a refused connection the kernel's count of failed connects (machine-wide, so a
    concurrent failure elsewhere could only make a skipped node look tried)."""
    samples: list[float | None] = []
    met: list[bool] = []
    misses = 0
    seen = refused_connects if kind == "refused" else lambda: first.counts()[0]
    for _ in range(count):
        before = seen()
        sample = load.first_byte(port, 5)
        samples.append(sample)
        met.append(seen() > before)
        misses = misses + 1 if sample is None else 0
        if misses >= 2:  # hangs: it relayed the stalled answer and has no way out
            break
    return samples, met


# -- routing cost ---------------------------------------------------------------------------------


def routing(plan: Plan, results: Results) -> None:
    _say(f"routing cost per request, {plan.route_models:,} models, in-process")
    try:
        # nvpair's own code, under change while the bench is written: a renamed seam is a
        # note (and a mypy error in bench/routecost.py), not a lost run.
        from bench import routecost
    except ImportError as error:
        results.note(f"routing cost not measured: {error}")
        return
    for r in range(plan.rounds):
        costs = routecost.sweep(plan.route_sizes, plan.route_models, plan.route_requests)
        for size, us in costs.items():
            results.put("route_us", str(size), r, us)
        _say(f"  round {r + 1}: " + ", ".join(f"{n}: {us:.1f} us" for n, us in costs.items()))


# -- what counting for /metrics costs ----------------------------------------------------------

#: Each round measures nvpair and nvpair+metrics twice, in A-B-B-A order, so that a drift of the
#: machine during the round weighs on both alike.
METRICS_ORDER = ("nvpair", "nvpair+metrics", "nvpair+metrics", "nvpair")


def metrics_cost(plan: Plan, results: Results, work: Path, names: Sequence[str]) -> None:
    """CPU per non-streaming request at c=32 with and without an admin listener, the two runs
    of each in a round averaged (``metrics_cpu_us``)."""
    _say("/metrics counting: CPU per request with and without an admin listener (A-B-B-A)")
    with node() as a, node() as b:
        for r in range(plan.rounds):
            runs: dict[str, list[float]] = {}
            for name in METRICS_ORDER:
                with _contender(results, name, Setup((a, b)), work, "metrics") as running:
                    if running is None:
                        return
                    ready(running.port, 180)
                    load.wrk(running.port, 2, plan.connections, work, stream=False)  # warm
                    before = cpu_seconds(running.pid)
                    run = load.wrk(running.port, plan.seconds, plan.connections, work, False)
                    used = cpu_seconds(running.pid) - before
                    if run.requests:
                        runs.setdefault(name, []).append(used / run.requests * 1e6)
            for name, values in runs.items():
                results.put("metrics_cpu_us", name, r, sum(values) / len(values))
            if len(runs) == 2:
                ratio = sum(runs["nvpair+metrics"]) / sum(runs["nvpair"])
                _say(f"  round {r + 1}: with / without {ratio:.3f}")


# -- instructions per request ---------------------------------------------------------------------


def instructions(plan: Plan, results: Results, work: Path, names: Sequence[str]) -> None:
    """User-space instructions per non-streaming request under callgrind (bench/instructions.py):
    one round, since the count repeats to within about 1 %."""
    from bench import instructions as counting

    if not counting.available():
        results.note("instructions not measured: valgrind is not installed")
        return
    _say("user-space instructions per request (callgrind, c=1)")
    with node() as a, node() as b:
        for name in names:
            sub = work / f"instructions-{name}"
            try:
                per = counting.per_request(name, Setup((a, b)), sub)
            except (RuntimeError, OSError, subprocess.SubprocessError) as error:
                results.note(f"instructions {name} failed: {error}")
                continue
            results.put("instructions_k", name, 0, per / 1000)
            _say(f"  {name}: {per / 1000:,.0f}k instructions per request")


# -- the cold-start mix: warm-aware order against the default order -----------------------------


def coldstart(plan: Plan, results: Results, work: Path, names: Sequence[str]) -> None:
    """The same seeded workload (a new seed each round) through both orders, fresh cold nodes
    for each (bench/coldstart.py)."""
    mix = Mix(seconds=plan.coldstart_seconds, zipf=plan.coldstart_zipf)
    room = plan.coldstart_room
    _say(
        f"cold-start mix: 4 Ollama nodes, 6 models, {room} in memory at once, "
        f"{LOAD_DELAY:g} s loads; "
        f"{mix.seconds:g} s of arrivals at {mix.rate:g}/s, popularity exponent {mix.zipf:g}"
    )
    for r in range(plan.rounds):
        requests = workload(plan.coldstart_seed + r, mix)
        _say(
            f"  round {r + 1}: {len(requests)} requests (seed {plan.coldstart_seed + r}), "
            f"offered concurrency {offered_concurrency(requests, mix):.1f}"
        )
        for name in names:
            step = partial(_coldstart, results, work, name, r, requests, mix, room)
            _guarded(results, f"cold-start mix {name}", step)


def _coldstart(
    results: Results,
    work: Path,
    name: str,
    r: int,
    requests: Sequence[Request],
    mix: Mix,
    room: int,
) -> None:
    sub = work / f"coldstart-{name}-{time.monotonic_ns()}"
    sub.mkdir()
    run = mix_run.run_side(name, requests, mix, sub, room)
    summary = summarize(run.outcomes)
    cold = sum(run.loads.values())
    results.put("mix_requests", name, r, summary.requests)
    results.put("mix_failed", name, r, summary.failed)
    results.put("mix_ttft_p50_ms", name, r, summary.ttft_p50_ms)
    results.put("mix_ttft_p99_ms", name, r, summary.ttft_p99_ms)
    results.put("mix_answer_p50_ms", name, r, summary.answer_p50_ms)
    results.put("mix_waited", name, r, summary.waited)
    results.put("mix_cold_starts", name, r, cold)
    results.put("mix_evictions", name, r, sum(run.evictions.values()))
    ttfts = [o.first_byte_ms for o in run.outcomes if o.ok and o.stream and o.first_byte_ms]
    results.sample("cold-start mix: streamed TTFT (ms)", name, ttfts)
    per_node = " / ".join(
        f"{node} {run.loads[node]}, {run.evictions.get(node, 0)}, {summary.served.get(node, 0)}"
        for node in sorted(run.loads)
    )
    results.note(
        f"cold-start mix round {r + 1}, {name} ({run.detail}): cold starts, evictions, answers "
        f"per node: {per_node}"
    )
    if summary.failed:
        errors = sorted({o.error or f"status {o.status}" for o in run.outcomes if not o.ok})
        results.note(f"cold-start mix {name}: {summary.failed} requests failed ({errors[:3]})")
    p50 = summary.ttft_p50_ms if summary.ttft_p50_ms is not None else float("nan")
    p99 = summary.ttft_p99_ms if summary.ttft_p99_ms is not None else float("nan")
    _say(
        f"  round {r + 1} {name}: TTFT p50 {p50:.1f} ms, p99 {p99:.0f} ms, {cold} cold starts, "
        f"{summary.waited} streams waited for a load, {summary.failed} failed "
        f"({run.seconds:.0f} s)"
    )


Runner = Callable[[Plan, Results, Path, Sequence[str]], None]

#: Every scenario, in the order a full run takes them: each is given the plan, the results,
#: a scratch directory and its contenders (:func:`contenders_for`).
RUNNERS: dict[str, Runner] = {
    "routing": lambda plan, results, work, names: routing(plan, results),
    "non-streaming": non_streaming,
    "instructions": instructions,
    "metrics": metrics_cost,
    "streaming": streaming,
    "failover": failover,
    "held": held_streams,
    "coldstart": coldstart,
    "multiturn": multiturn.run,
    "contention": contention.run,
}
SCENARIOS = tuple(RUNNERS)


def contenders_for(scenario: str) -> tuple[str, ...]:
    """Who takes part: LiteLLM only where the issue compares it (req/s); direct where there
    is no failover to measure; nvpair's two orders in the cold-start mix; affinity off and on
    in the multi-turn bench; the queue off and on in the contention bench."""
    if scenario == "non-streaming":
        return ("direct", "nvpair", "floor", "nginx", "litellm")
    if scenario == "instructions":
        return ("nvpair", "nvpair+metrics", "floor")
    if scenario == "metrics":
        return ("nvpair", "nvpair+metrics")
    if scenario == "failover":
        return ("nvpair", "floor", "nginx")
    if scenario == "coldstart":
        return mix_run.SIDES
    if scenario == "multiturn":
        return multiturn.SIDES
    if scenario == "contention":
        return contentionload.SIDES
    return ("direct", "nvpair", "floor", "nginx")
