"""``make soak`` (``python -m bench.soak --duration S``): mixed traffic with random faults against
the real proxy; at the end its in-flight count, reservations, fds and RSS must be back where they
were after warm-up, every request answered or cleanly closed, and its log free of failures.

Timeline: the simulated fleet (this process) and ``twistd -n nvpair-proxy --fleet`` start; traffic
runs a warm-up without faults; a quiet baseline is sampled; traffic runs on with faults coming and
going until ``--duration`` is up; the clients finish what they started; faults are cleared; after a
settle the proxy is sampled as left, then once more in the baseline's quiet state. Samples every
10 s in between. Exits 1 when any criterion fails (see ``bench.soak.judge`` for the bounds).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import attrs
from twisted.internet import task
from twisted.internet.defer import Deferred, gatherResults
from twisted.logger import (
    FilteringLogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    globalLogBeginner,
    textFileLogObserver,
)

from bench.soak import probe
from bench.soak.client import Clients, get_json, send
from bench.soak.judge import Sample, Tally, fleet_up, judge, report
from bench.soak.nodes import Chaos, Fleet
from bench.soak.plan import ENGINES, NODES, Ending, draw_request, fleet_toml

TWISTD = str(Path(sys.executable).parent / "twistd")
INVENTORY_INTERVAL = 1.0
SAMPLE_EVERY = 10.0
SETTLE = 5.0
#: After the quiet reset: two inventory polls, so each engine's poll connection is back.
QUIET_WAIT = 2 * INVENTORY_INTERVAL + 0.5

#: Bounds shrunk so faults resolve within seconds rather than the defaults' minutes.
PROXY_BOUNDS = (
    "--response-header-timeout",
    "5s",
    "--job-deadline",
    "20s",
    "--retry-backoff",
    "50ms",
    "--client-write-timeout",
    "5s",
    "--dial-timeout",
    "2s",
)


def free_port() -> int:
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        port: int = probe_socket.getsockname()[1]
        return port


def sleep(reactor: Any, seconds: float) -> Deferred[None]:
    d: Deferred[None] = task.deferLater(reactor, seconds, lambda: None)
    return d


@attrs.define
class Run:
    """The live state of one soak run."""

    reactor: Any
    args: argparse.Namespace
    fleet: Fleet
    proxy: subprocess.Popen[bytes]
    admin: int
    facades: dict[str, int]
    clients: Clients
    chaos: Chaos
    tally: Tally = attrs.Factory(Tally)
    samples: list[Sample] = attrs.Factory(list)
    phase: str = "start"
    started: float = 0.0
    abort: bool = False

    @property
    def alive(self) -> bool:
        return self.proxy.poll() is None

    # -- admin and samples ---------------------------------------------------------------------

    async def status(self) -> dict[str, Any] | None:
        """The admin ``/status``, or None when it does not answer within 5 s."""
        status = await get_json(self.reactor, f"http://127.0.0.1:{self.admin}/status", 5)
        return status if isinstance(status, dict) else None

    async def sample(self, phase: str | None = None) -> Sample | None:
        if not self.alive:
            self.abort = True
            return None
        pid = self.proxy.pid
        status = await self.status()
        own = frozenset([*self.facades.values(), self.admin])
        in_flight = status.get("inFlight") if status else None
        reservations = status.get("reservations") if status else None
        try:
            sockets = probe.sockets(pid, own, self.fleet.ports)
            rss_kb, fds = probe.rss_kb(pid), probe.fd_count(pid)
        except OSError:  # the proxy exited while we looked
            self.abort = True
            return None
        taken = Sample(
            t=self.reactor.seconds() - self.started,
            phase=phase or self.phase,
            rss_kb=rss_kb,
            fds=fds,
            upstream=sockets.upstream,
            clients=sockets.clients,
            in_flight=in_flight if isinstance(in_flight, int) else None,
            reservations=dict(reservations) if isinstance(reservations, dict) else None,
            finished=self.tally.finished,
            faults=self.chaos.active,
        )
        self.samples.append(taken)
        reserved = sum(taken.reservations.values()) if taken.reservations else 0
        print(
            f"  t={taken.t:5.0f}s {taken.phase:9} rss={taken.rss_kb / 1024:6.1f} MB "
            f"fds={taken.fds:4} upstream={taken.upstream:3} clients={taken.clients:3} "
            f"inFlight={taken.in_flight} reserved={reserved} done={taken.finished} "
            f"faults={taken.faults}",
            flush=True,
        )
        return taken

    async def quiet_sample(self, phase: str) -> Sample | None:
        """A sample in the quiet state the fd criterion compares (see ``bench.soak.judge``)."""
        await self.clients.close_idle()
        await self.fleet.reset_connections()
        await sleep(self.reactor, QUIET_WAIT)
        return await self.sample(phase)

    # -- traffic -------------------------------------------------------------------------------

    async def worker(self, rng: random.Random, until: float) -> None:
        while self.reactor.seconds() < until and not self.abort:
            spec = draw_request(rng)
            self.tally.sent += 1
            base = f"http://127.0.0.1:{self.facades[spec.engine]}"
            outcome = await send(self.reactor, self.clients, base, spec, self.args.timeout)
            label = spec.kind if spec.ending is Ending.READ else f"{spec.kind} {spec.ending.value}"
            self.tally.record(label, outcome)

    async def traffic(self, rng: random.Random, seconds: float) -> None:
        """``--concurrency`` workers sending until ``seconds`` from now, then finishing."""
        until = self.reactor.seconds() + seconds
        workers = [
            Deferred.fromCoroutine(self.worker(random.Random(rng.random()), until))
            for _ in range(self.args.concurrency)
        ]
        await gatherResults(workers, consumeErrors=True)

    async def ready(self, seconds: float = 30) -> bool:
        """Every facade up and every node in every engine's discovery."""
        deadline = self.reactor.seconds() + seconds
        while self.reactor.seconds() < deadline and self.alive:
            if fleet_up(await self.status(), ENGINES, NODES):
                return True
            await sleep(self.reactor, 0.2)
        return False


def start_proxy(work: Path, fleet_file: Path, admin: int) -> subprocess.Popen[bytes]:
    argv = [
        TWISTD,
        "--pidfile=",
        "-n",
        "nvpair-proxy",
        "--fleet",
        str(fleet_file),
        "--state-dir",
        str(work / "state"),
        "--admin-port",
        str(admin),
        "--log-level",
        "info",  # workload events are debug: far too many lines at this rate
        *PROXY_BOUNDS,
    ]
    with (work / "proxy.log").open("wb") as log, (work / "proxy.stdout").open("wb") as out:
        return subprocess.Popen(
            argv,
            cwd=work,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=log,
            start_new_session=True,
        )


def stop_proxy(proxy: subprocess.Popen[bytes]) -> None:
    if proxy.poll() is not None:
        return
    os.killpg(proxy.pid, signal.SIGTERM)
    try:
        proxy.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proxy.pid, signal.SIGKILL)
        proxy.wait()


async def soak(reactor: Any, args: argparse.Namespace, work: Path) -> bool:
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    warm = min(30.0, max(5.0, args.duration / 10))
    print(
        f"soak: {args.duration:.0f} s of traffic ({warm:.0f} s warm-up without faults), "
        f"{args.concurrency} clients, seed {seed}, work dir {work}",
        flush=True,
    )
    fleet = Fleet(reactor, args.chunk_interval, args.tokens)
    facades = {engine: free_port() for engine in ENGINES}
    admin = free_port()
    fleet_file = work / "fleet.toml"
    fleet_file.write_text(fleet_toml(f"{INVENTORY_INTERVAL:g}s", facades, fleet.urls()))
    proxy = start_proxy(work, fleet_file, admin)
    chaos = Chaos(reactor, fleet, random.Random(seed + 1), args.fault_every, args.max_faults)
    run = Run(
        reactor, args, fleet, proxy, admin, facades, Clients(reactor, args.concurrency), chaos
    )
    baseline = settled = final = None
    alive = False
    try:
        if not await run.ready():
            print(f"soak: the proxy did not come up; see {work / 'proxy.log'}", flush=True)
            return False
        rng = random.Random(seed)
        run.started = reactor.seconds()
        sampler = task.LoopingCall(lambda: Deferred.fromCoroutine(run.sample()))
        sampler.clock = reactor
        run.phase = "warm-up"
        sampler.start(SAMPLE_EVERY, now=True)
        await run.traffic(rng, warm)
        baseline = await run.quiet_sample("baseline")
        run.phase = "faults"
        chaos.start()

        def drain() -> None:
            # No new requests from here on; the ones started finish (or time out).
            chaos.stop()
            run.phase = "drain"

        stop_faults = reactor.callLater(args.duration - warm, drain)
        await run.traffic(rng, args.duration - warm)
        if stop_faults.active():
            stop_faults.cancel()
        chaos.stop()
        run.phase = "settle"
        await sleep(reactor, SETTLE)
        sampler.stop()
        settled = await run.sample("settled")
        final = await run.quiet_sample("final")
        alive = run.alive
    finally:
        stop_proxy(proxy)
        await fleet.stop()
    log = probe.read_log(work / "proxy.log")
    if baseline is None or settled is None or final is None:
        print(f"soak: the proxy exited during the run; see {work / 'proxy.log'}", flush=True)
        print(report(run.samples, run.tally, chaos.injected, log, []), flush=True)
        return False
    verdicts = judge(baseline, settled, final, run.tally, log, alive)
    print(report(run.samples, run.tally, chaos.injected, log, verdicts), flush=True)
    if chaos.failed_resumes:
        print(f"note: {chaos.failed_resumes} refused engines could not listen again", flush=True)
    return all(v.passed for v in verdicts)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--duration", type=float, default=600, help="seconds of traffic")
    parser.add_argument("--concurrency", type=int, default=24, help="clients at once")
    parser.add_argument("--timeout", type=float, default=60, help="per request; longer = hang")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--fault-every", type=float, default=2.0, help="seconds between faults")
    parser.add_argument("--max-faults", type=int, default=4, help="engines faulted at once")
    parser.add_argument("--tokens", type=int, default=16, help="streamed chunks per answer")
    parser.add_argument("--chunk-interval", type=float, default=0.02)
    parser.add_argument("--keep", action="store_true", help="keep the work dir even on PASS")
    args = parser.parse_args()
    if args.duration < 20:
        parser.error("--duration must be at least 20 s")
    if not 1 <= args.concurrency <= 64:
        parser.error("--concurrency must be 1-64")

    # The soak's own warnings (a client callback raising, say) on stderr; the proxy logs to a file.
    observer = FilteringLogObserver(
        textFileLogObserver(sys.stderr), [LogLevelFilterPredicate(LogLevel.warn)]
    )
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)
    work = Path(tempfile.mkdtemp(prefix="nvpair-soak-"))
    passed = False

    async def body(reactor: Any) -> None:
        nonlocal passed
        passed = await soak(reactor, args, work)

    try:
        task.react(lambda reactor: Deferred.fromCoroutine(body(reactor)))
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            raise
    if passed and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    elif not passed:
        print(f"soak: kept {work} (fleet.toml, proxy.log)", file=sys.stderr)
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
