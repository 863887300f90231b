"""Pure: the soak's records (samples, the client-side tally) and its verdict, and the report.

The bounds, and why they are what they are:

- **fds**: both the baseline and the final fd count are taken in the same quiet state — no
  request in flight, the clients' idle keep-alive connections closed, every simulated engine's
  connections reset and polled again — so what is left is listeners, log and state files, the
  poller's one pooled connection per engine, and whatever leaked. ``FD_TOLERANCE`` covers what
  can still differ between two such moments: the admin request of the sample itself, an
  inventory poll caught between its two pooled connections, a client close the proxy has not
  read yet. A leak of one fd per thousand requests exceeds it within a 10-minute run; a leak
  per faulted request does in a minute.
- **RSS**: the baseline is taken after warm-up at full concurrency, so buffers, pools and the
  allocator's arenas are at working size. What may still grow is arena fragmentation and the
  idle upstream pool at its fault-driven peak (bounded by connections, a few MB). A 10-minute
  run sends tens of thousands of requests: a leak of 1 KB per request would pass ``RSS_BOUND``
  of 30 MB only for runs under about 30,000 requests, and the report prints the growth per
  thousand requests for the short runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import attrs

from bench.soak.client import ANSWERED, CLOSED, CUT, ERROR, KINDS, TIMEOUT, Outcome
from bench.soak.probe import LogSummary

FD_TOLERANCE = 8
RSS_BOUND_MB = 30.0


def fleet_up(status: object, engines: Sequence[str], nodes: Sequence[str]) -> bool:
    """Whether the admin ``/status`` shows every one of ``nodes`` up for every engine.

    ``status["nodes"][engine]`` lists each configured node with its one-word ``state``
    (docs/operations.md#status).
    """
    if not isinstance(status, dict):
        return False
    listed = status.get("nodes")
    if not isinstance(listed, dict):
        return False
    for engine in engines:
        entries = listed.get(engine)
        if not isinstance(entries, list):
            return False
        up = {e.get("id") for e in entries if isinstance(e, dict) and e.get("state") == "up"}
        if not up.issuperset(nodes):
            return False
    return True


@attrs.frozen
class Sample:
    """The proxy at one moment.

    :param t: seconds since traffic began.
    :param phase: ``warm-up``, ``faults``, ``drain``, ``baseline``, ``settled``, ``final``.
    :param upstream: its sockets to simulated engines; :param clients: accepted client sockets.
    :param in_flight: ``inFlight`` of the admin ``/status`` (None when it did not answer).
    :param reservations: its ``reservations`` (None when it did not answer or lacks the field).
    :param finished: client exchanges finished so far; :param faults: faults on right now.
    """

    t: float
    phase: str
    rss_kb: int
    fds: int
    upstream: int
    clients: int
    in_flight: int | None
    reservations: Mapping[str, int] | None
    finished: int
    faults: int


@attrs.define
class Tally:
    """Client-side counts: what was sent and how each exchange ended."""

    sent: int = 0
    kinds: Counter[str] = attrs.Factory(Counter)
    answers: Counter[tuple[int, str]] = attrs.Factory(Counter)
    by_request: Counter[tuple[str, str]] = attrs.Factory(Counter)
    details: Counter[str] = attrs.Factory(Counter)
    slowest: float = 0.0

    @property
    def finished(self) -> int:
        return sum(self.kinds.values())

    def record(self, label: str, outcome: Outcome) -> None:
        self.kinds[outcome.kind] += 1
        self.by_request[label, outcome.kind] += 1
        if outcome.status is not None:
            self.answers[outcome.status, outcome.reason or "-"] += 1
        if outcome.detail:
            self.details[f"{outcome.kind}: {outcome.detail}"] += 1
        if outcome.kind == ANSWERED:
            self.slowest = max(self.slowest, outcome.seconds)


@attrs.frozen
class Verdict:
    criterion: str
    passed: bool
    detail: str


def judge(
    baseline: Sample,
    settled: Sample,
    final: Sample,
    tally: Tally,
    log: LogSummary,
    proxy_alive: bool,
) -> list[Verdict]:
    """PASS/FAIL per criterion.

    :param settled: after traffic stopped, faults cleared and a settle (connections as left).
    :param final: the same, after the quiet-state preparation the baseline had.
    """
    pending = tally.sent - tally.finished
    hung = tally.kinds[TIMEOUT]
    errors = tally.kinds[ERROR]
    rss_growth = (final.rss_kb - baseline.rss_kb) / 1024
    verdicts = [
        Verdict(
            "every request answered or closed",
            pending == 0 and hung == 0 and errors == 0,
            f"{tally.sent} sent, {tally.kinds[ANSWERED]} answered, {tally.kinds[CUT]} cut "
            f"mid-body, {tally.kinds[CLOSED]} closed before status, {hung} timed out, "
            f"{errors} client errors, {pending} never finished",
        ),
        Verdict(
            "in-flight back to 0",
            settled.in_flight == 0 and final.in_flight == 0,
            f"settled {settled.in_flight}, final {final.in_flight}",
        ),
        Verdict(
            "reservations empty",
            settled.reservations == {} and final.reservations == {},
            f"settled {_reservations(settled)}, final {_reservations(final)}",
        ),
        Verdict(
            f"fds back to baseline (+{FD_TOLERANCE})",
            final.fds <= baseline.fds + FD_TOLERANCE,
            f"baseline {baseline.fds}, final {final.fds} "
            f"(settled, before the quiet reset: {settled.fds})",
        ),
        Verdict(
            f"RSS growth < {RSS_BOUND_MB:.0f} MB",
            rss_growth < RSS_BOUND_MB,
            f"{baseline.rss_kb / 1024:.1f} -> {final.rss_kb / 1024:.1f} MB "
            f"({rss_growth:+.1f} MB, {_per_thousand(rss_growth, tally.sent)})",
        ),
        Verdict(
            "no failure in the proxy log",
            not log.problems,
            f"{len(log.problems)} lines with a traceback or Unhandled Error",
        ),
        Verdict("proxy still running", proxy_alive, "yes" if proxy_alive else "it exited"),
    ]
    return verdicts


def _per_thousand(growth_mb: float, sent: int) -> str:
    if not sent:
        return "no requests"
    return f"{growth_mb * 1024 / (sent / 1000):+.1f} KB per 1000 requests"


def _reservations(sample: Sample) -> str:
    if sample.reservations is None:
        return "not reported"
    return str(dict(sample.reservations)) if sample.reservations else "{}"


def report(
    samples: Sequence[Sample],
    tally: Tally,
    injected: Mapping[str, int],
    log: LogSummary,
    verdicts: Sequence[Verdict],
) -> str:
    """The printable report: samples, answers, faults, log, verdicts."""
    out = ["", "samples (every 10 s; baseline/settled/final are the judged moments)"]
    out.append(
        f"{'t s':>6} {'phase':9} {'RSS MB':>7} {'fds':>5} {'upstr':>5} {'client':>6} "
        f"{'inflight':>8} {'done':>7} {'faults':>6}  reservations"
    )
    for s in samples:
        in_flight = "-" if s.in_flight is None else str(s.in_flight)
        out.append(
            f"{s.t:6.0f} {s.phase:9} {s.rss_kb / 1024:7.1f} {s.fds:5} {s.upstream:5} "
            f"{s.clients:6} {in_flight:>8} {s.finished:7} {s.faults:6}  {_reservations(s)}"
        )
    out += ["", f"client exchanges: {tally.sent} sent"]
    out += [f"  {kind:28} {tally.kinds[kind]:7}" for kind in KINDS if tally.kinds[kind]]
    if tally.slowest:
        out.append(f"  slowest complete answer: {tally.slowest:.1f} s")
    out += ["", "answers by status and X-Nvpair-Error ('-': relayed from an engine)"]
    for (status, reason), count in sorted(tally.answers.items()):
        out.append(f"  {status} {reason:24} {count:7}")
    if tally.details:
        out += ["", "failures before a status, by what the client saw"]
        out += [f"  {detail:60} {n:7}" for detail, n in tally.details.most_common(10)]
    out += ["", "requests by kind, and how they ended when not answered"]
    for label in sorted({label for label, _ in tally.by_request}):
        ends = {kind: n for (lbl, kind), n in tally.by_request.items() if lbl == label}
        others = ", ".join(f"{n} {kind}" for kind, n in ends.items() if kind != ANSWERED)
        out.append(f"  {label:28} {sum(ends.values()):7}  {others}")
    out += ["", "faults injected"]
    out += [f"  {kind:28} {n:7}" for kind, n in sorted(injected.items())] or ["  none"]
    levels = ", ".join(f"{level} {n}" for level, n in sorted(log.levels.items()))
    out += ["", f"proxy log lines: {levels or 'none'}"]
    out += [f"  {n:6}  {message}" for message, n in log.messages.most_common(12)]
    for line in log.problems[:5]:
        out.append(f"  PROBLEM: {line[:400]}")
    out += ["", "verdict"]
    for v in verdicts:
        out.append(f"  {'PASS' if v.passed else 'FAIL'}  {v.criterion}: {v.detail}")
    passed = all(v.passed for v in verdicts)
    out += ["", f"soak {'PASSED' if passed else 'FAILED'}", ""]
    return "\n".join(out)
