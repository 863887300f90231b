"""The contention bench: the fleet's queue on against ``[queue] enabled = false``, the same
requests both sides (docs/fleet-scheduling.md#the-queue; bench/README.md "The fleet's queue").

Per round, per part, per side: fresh engines (simulated by :mod:`bench.simnode`, or for the
real-engine part three ``llama-server -np 1``), a fresh ``twistd -n nvpair-proxy --fleet FILE``
in front of them with the queue on or off and a key per caller (:mod:`bench.contentionload`),
and the part's requests played through it by an asyncio client (no Twisted: the client must not
share a design with what it measures). Each request is streamed on a connection of its own; the
client records its time to first token, its status, ``X-Nvpair-Queued-Ms`` and
``X-Nvpair-Node``. The collation part also reads each box's own count of model loads.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from bench.chatclient import ERROR_SNIPPET, FAILURES, Answer, ChatStream, exchange
from bench.contenders import Cold, Node, node
from bench.contentionload import (
    CHAT,
    CUT,
    FLOOD,
    HIGH,
    LOW,
    MIX,
    Ask,
    Caller,
    Collation,
    Fairness,
    Figures,
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
    of,
    priority_figures,
    ttfts,
)
from bench.llamanodes import MODEL, llama_node, model_path, post_json
from bench.procs import TWISTD, free_port, process, wait_until

if TYPE_CHECKING:
    from bench.scenarios import Plan, Results

PATH = "/v1/chat/completions"
#: Seconds one request may take, waiting included, before it is a failure.
REQUEST_TIMEOUT = 180.0
#: The model a simulated llama.cpp node serves.
SIM_MODEL = "tiny"


# -- the proxy ----------------------------------------------------------------------------------


@attrs.frozen
class Proxy:
    port: int
    admin: int
    pid: int


def _status(admin: int) -> object:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/status", timeout=10) as answer:
        return json.loads(answer.read())


def _all_up(admin: int, engine: str, count: int) -> bool:
    try:
        status = _status(admin)
    except (OSError, ValueError):
        return False
    nodes = status.get("nodes", {}).get(engine, []) if isinstance(status, dict) else []
    return len(nodes) == count and all(n.get("state") == "up" for n in nodes)


@contextmanager
def proxy(
    engine: str,
    nodes: Sequence[tuple[str, str]],
    queue: bool,
    work: Path,
    collate: float | None = None,
) -> Iterator[Proxy]:
    """nvpair in fleet mode in front of ``nodes`` (id, URL), the queue on or off, once every
    node is up in its ``/status``."""
    port, admin = free_port(), free_port()
    (work / "keys.toml").write_text(keys_text())
    config = work / "fleet.toml"
    config.write_text(fleet_text(engine, port, nodes, queue, collate))
    argv = [TWISTD, "--pidfile=", "-n", "nvpair-proxy", "--fleet", str(config)]
    argv += ["--admin-port", str(admin), "--state-dir", str(work / "state")]
    argv += ["--log-level", "warn"]
    with (
        open(work / "proxy.log", "wb") as log,
        process(argv, cwd=work, stdin=subprocess.DEVNULL, stdout=log, stderr=log) as child,
    ):
        wait_until(
            lambda: child.poll() is not None or _all_up(admin, engine, len(nodes)),
            60,
            "every node up",
        )
        if child.poll() is not None:
            raise RuntimeError(f"the proxy exited with {child.returncode} (see {log.name})")
        yield Proxy(port, admin, child.pid)


# -- the client ---------------------------------------------------------------------------------


def request_bytes(port: int, caller: Caller, body: bytes) -> bytes:
    head = [
        f"POST {PATH} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Connection: close",
        "Content-Type: application/json",
        f"Authorization: Bearer {caller.secret}",
        f"Content-Length: {len(body)}",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@attrs.define
class Clock:
    """The run's start on the event loop's clock, and whether it is being wound up: a request
    cancelled then is :data:`~bench.contentionload.CUT`, not failed."""

    start: float
    stopping: bool = False

    def since(self) -> float:
        return asyncio.get_running_loop().time() - self.start


async def ask(port: int, caller: Caller, body: bytes, clock: Clock, model: str = "") -> Outcome:
    """One streamed chat through ``port`` as ``caller``, read to its end."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    stream = ChatStream()
    answer = Answer()
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT):
            await exchange(port, request_bytes(port, caller, body), stream, answer)
    except asyncio.CancelledError:
        if not clock.stopping:
            raise
        # Wound up at the run's end: the cancellation is the run's, not the request's fate.
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        answer.error = CUT
    except FAILURES as failure:
        answer.error = f"{type(failure).__name__}: {failure}"[:ERROR_SNIPPET]
    error = answer.error
    if not error and not stream.done:
        error = stream.error or "the stream ended without [DONE]"
    waited = answer.headers.get(b"x-nvpair-queued-ms")
    return Outcome(
        caller.name,
        started - clock.start,
        answer.status,
        (answer.first - started) * 1000 if answer.first is not None else None,
        loop.time() - clock.start,
        float(waited) if waited is not None else None,
        answer.headers.get(b"x-nvpair-node", b"").decode("latin-1"),
        model,
        error,
    )


async def _closed_loop(
    port: int,
    caller: Caller,
    bodies: Sequence[tuple[bytes, str]],
    clock: Clock,
    begin: float,
    end: float,
) -> list[Outcome]:
    """One worker: from ``begin``, each request sent when the one before ends, none after
    ``end`` (seconds from the start) or once the run is wound up."""
    await asyncio.sleep(max(0.0, begin - clock.since()))
    out: list[Outcome] = []
    for body, model in bodies:
        if clock.stopping or clock.since() >= end:
            break
        out.append(await ask(port, caller, body, clock, model))
    return out


async def _at_times(
    port: int, caller: Caller, timed: Sequence[tuple[float, bytes, str]], clock: Clock
) -> list[Outcome]:
    """Each request sent at its time (seconds from the start), all read to their end."""
    tasks: list[asyncio.Task[Outcome]] = []
    for at, body, model in timed:
        delay = at - clock.since()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(ask(port, caller, body, clock, model)))
    return list(await asyncio.gather(*tasks))


# -- the parts ----------------------------------------------------------------------------------


@attrs.frozen
class Flooded:
    """A fairness (or priority) run: the flood's window and every request."""

    flood_start: float
    flood_end: float
    outcomes: list[Outcome]

    @property
    def window(self) -> tuple[float, float]:
        return self.flood_start, self.flood_end


async def _flooded(
    port: int,
    shape: Fairness,
    seed: int,
    flooder: Caller,
    chatter: Caller,
    model: str,
    real: bool,
) -> Flooded:
    clock = Clock(asyncio.get_running_loop().time())
    begin, end = shape.idle, shape.idle + shape.seconds
    chats = [
        (at, chat_body(model, shape.chat_tokens, f"chat {i}", real), model)
        for i, at in enumerate(chat_times(shape))
    ]
    workers = []
    for w in range(shape.flood):
        bodies = [
            (chat_body(model, tokens, f"flood {w}.{k}", real), model)
            for k, tokens in enumerate(flood_lengths(seed, shape, w))
        ]
        # Started a little apart, as a batch client ramps up, so the answers do not all end
        # together round after round.
        start = begin + w * min(1.0, shape.service) / shape.flood
        workers.append(
            asyncio.create_task(_closed_loop(port, flooder, bodies, clock, start, float("inf")))
        )
    chatted = await _at_times(port, chatter, chats, clock)
    # The flood goes on until the last chat is answered, so every chat met it, and at least
    # to the end of its window, over which its completed requests are counted.
    await asyncio.sleep(max(0.0, end - clock.since()))
    clock.stopping = True
    for worker in workers:
        worker.cancel()
    flooded = await asyncio.gather(*workers, return_exceptions=True)
    outcomes = list(chatted)
    for result in flooded:
        if isinstance(result, BaseException):
            raise RuntimeError(f"a flood worker failed: {result!r}")
        outcomes += result
    return Flooded(begin, end, outcomes)


def play_flooded(
    port: int,
    shape: Fairness,
    seed: int,
    flooder: Caller,
    chatter: Caller,
    model: str = SIM_MODEL,
    real: bool = False,
) -> Flooded:
    return asyncio.run(_flooded(port, shape, seed, flooder, chatter, model, real))


async def _open_loop(port: int, asks: Sequence[Ask], caller: Caller, model: str) -> list[Outcome]:
    clock = Clock(asyncio.get_running_loop().time())
    timed = [(a.at, chat_body(model, a.tokens, f"late {i}"), model) for i, a in enumerate(asks)]
    return await _at_times(port, caller, timed, clock)


def play_open_loop(
    port: int, asks: Sequence[Ask], caller: Caller = MIX, model: str = SIM_MODEL
) -> list[Outcome]:
    return asyncio.run(_open_loop(port, asks, caller, model))


async def _mixed(port: int, shape: Collation, seed: int) -> list[Outcome]:
    clock = Clock(asyncio.get_running_loop().time())
    workers = []
    for w in range(shape.workers):
        bodies = [
            (chat_body(model, shape.tokens, f"mix {w}.{k}"), model)
            for k, model in enumerate(mix_models(seed, shape, w))
        ]
        start = w * shape.service / shape.workers
        workers.append(_closed_loop(port, MIX, bodies, clock, start, shape.seconds))
    # No request is cut: the ones still waiting at the end are the ones collation passed over
    # longest, and their waits are what is judged.
    done = await asyncio.gather(*workers)
    return [o for outcomes in done for o in outcomes]


def play_mixed(port: int, shape: Collation, seed: int) -> list[Outcome]:
    return asyncio.run(_mixed(port, shape, seed))


# -- the fleets ---------------------------------------------------------------------------------


class Occupancy:
    """Samples the engines' places every :data:`EVERY` seconds while a run plays: how many of
    them are busy on average over a window, and the most answers any engine held waiting.

    :param readers: one per engine: (answers holding a place, answers waiting for one) now.
    """

    EVERY = 0.25

    def __init__(self, readers: Sequence[Callable[[], tuple[int, int]]]) -> None:
        self._readers = readers
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._start = time.monotonic()
        #: (seconds since the sampling began, places busy, most waiting in one engine)
        self.readings: list[tuple[float, int, int]] = []

    def __enter__(self) -> Occupancy:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(self.EVERY):
            try:
                places = [read() for read in self._readers]
            except (OSError, ValueError):
                continue
            self.readings.append(
                (
                    time.monotonic() - self._start,
                    sum(r for r, _ in places),
                    max((w for _, w in places), default=0),
                )
            )

    def busy(self, since: float = 0.0, until: float = float("inf")) -> float | None:
        """Places busy on average between ``since`` and ``until`` seconds into the sampling."""
        chosen = [r for t, r, _ in self.readings if since <= t <= until]
        return sum(chosen) / len(chosen) if chosen else None

    def most_waiting(self) -> int:
        return max((w for _, _, w in self.readings), default=0)


@contextmanager
def llama_sims(
    count: int, slots: int, tokens: int, intervals: Sequence[float]
) -> Iterator[list[tuple[str, Node]]]:
    """``count`` simulated llama.cpp nodes of ``slots`` slots, answering up to ``tokens``
    tokens, node ``i`` one every ``intervals[i]`` seconds."""
    with ExitStack() as stack:
        yield [
            (
                f"n{i}",
                stack.enter_context(node(tokens=tokens, interval=intervals[i], parallel=slots)),
            )
            for i in range(count)
        ]


@contextmanager
def ollama_boxes(shape: Collation) -> Iterator[list[tuple[str, Node]]]:
    """Small Ollama boxes: every model listed, none in memory at the start, room for one,
    ``OLLAMA_NUM_PARALLEL`` at its default (1), models kept in memory until evicted."""
    cold = Cold(shape.models, shape.load_delay, keep_alive=3600.0, max_loaded=1)
    with ExitStack() as stack:
        yield [
            (
                f"box{i}",
                stack.enter_context(
                    node(tokens=shape.tokens, interval=shape.token_seconds, cold=cold)
                ),
            )
            for i in range(shape.boxes)
        ]


def _urls(nodes: Sequence[tuple[str, Node]]) -> list[tuple[str, str]]:
    return [(name, n.url) for name, n in nodes]


def run_flooded(
    side: str, shape: Fairness, seed: int, flooder: Caller, chatter: Caller, work: Path
) -> tuple[Flooded, Occupancy]:
    """A fairness (or priority) run on fresh simulated llama.cpp nodes."""
    high = shape.flood_tokens[1]
    intervals = [shape.token_seconds] * shape.nodes
    with (
        llama_sims(shape.nodes, shape.slots, high, intervals) as nodes,
        proxy("llamacpp", _urls(nodes), side == "queue-on", work) as running,
        Occupancy([n.places for _, n in nodes]) as occupancy,
    ):
        return play_flooded(running.port, shape, seed, flooder, chatter), occupancy


def run_late(
    side: str, shape: LateBinding, asks: Sequence[Ask], work: Path
) -> tuple[list[Outcome], Occupancy]:
    """A late-binding run: the last node ``slow`` times slower than the others."""
    intervals = [shape.token_seconds] * (shape.nodes - 1) + [shape.token_seconds * shape.slow]
    with (
        llama_sims(shape.nodes, shape.slots, shape.tokens[1], intervals) as nodes,
        proxy("llamacpp", _urls(nodes), side == "queue-on", work) as running,
        Occupancy([n.places for _, n in nodes]) as occupancy,
    ):
        return play_open_loop(running.port, asks), occupancy


@attrs.frozen
class Mixed:
    outcomes: list[Outcome]
    loads: dict[str, int]
    evictions: dict[str, int]
    occupancy: Occupancy


def run_collation(side: str, shape: Collation, seed: int, work: Path) -> Mixed:
    """A collation run on fresh small Ollama boxes; their own count of loads after it."""
    with (
        ollama_boxes(shape) as boxes,
        proxy("ollama", _urls(boxes), side == "queue-on", work, shape.collate) as running,
    ):
        with Occupancy([n.places for _, n in boxes]) as occupancy:
            outcomes = play_mixed(running.port, shape, seed)
        loads = {name: n.loads() for name, n in boxes}
        evictions = {name: n.evictions() for name, n in boxes}
    return Mixed(outcomes, loads, evictions, occupancy)


# -- the real engines ---------------------------------------------------------------------------

#: llama-server answers with a pool of HTTP threads, by default as many as the machine's cores
#: less one (at least its slots plus two): on a two-core machine three, so a fourth connection
#: — the proxy's poll among them — would wait in its accept queue behind streams. A LAN box has
#: more cores than that; so many that no connection of this bench waits for a thread.
HTTP_THREADS = 64
#: Seconds a real flood answer takes, about (the calibration gives the tokens).
REAL_ANSWER = 2.0


#: Tokens the probes generate first, and how many times they measure, each time at the length
#: the one before said would take :data:`REAL_ANSWER`.
PROBE_TOKENS = 400
PROBE_STEPS = 3


def _generate(url: str, tokens: int) -> float:
    """Seconds ``url`` takes to generate ``tokens`` tokens for a short prompt, by the clock."""
    began = time.monotonic()
    post_json(
        url + "/completion",
        {"prompt": "hello", "n_predict": tokens, "ignore_eos": True, "cache_prompt": False},
    )
    return time.monotonic() - began


def _together(urls: Sequence[str], tokens: int) -> float:
    """The median seconds ``urls`` take to generate ``tokens`` tokens each, all at once."""
    timed: list[float] = []
    threads = [
        threading.Thread(target=lambda u=url: timed.append(_generate(u, tokens))) for url in urls
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if len(timed) != len(urls):
        raise RuntimeError("a probe server did not answer")
    return statistics.median(timed)


def real_shape(seconds: float, model: Path) -> tuple[Fairness, list[tuple[int, float]]]:
    """The fairness part for three one-slot ``llama-server`` processes, with flood answers of
    about :data:`REAL_ANSWER` seconds, and the probes that found the length: three servers
    generating at once, as the three nodes will, at the length the probe before said would
    take that long (a token costs more the longer the answer so far)."""
    tokens = PROBE_TOKENS
    probes: list[tuple[int, float]] = []
    with ExitStack() as stack:
        urls = [stack.enter_context(llama_node(f"probe{i}", model, slots=1)).url for i in range(3)]
        for _ in range(PROBE_STEPS):
            took = _together(urls, tokens)
            probes.append((tokens, took))
            tokens = max(1, round(tokens * REAL_ANSWER / took))
    shape = Fairness(
        seconds=seconds,
        nodes=3,
        slots=1,
        flood_tokens=(round(tokens * 0.75), round(tokens * 1.25)),
        token_seconds=REAL_ANSWER / tokens,
    )
    return shape, probes


def busy_slots(url: str) -> tuple[int, int]:
    """A real server's slots processing now (its ``/slots``); it shows no waiting requests."""
    with urllib.request.urlopen(url + "/slots", timeout=5) as answer:
        slots = json.loads(answer.read())
    return sum(1 for slot in slots if slot.get("is_processing")), 0


def run_real(
    side: str, shape: Fairness, seed: int, model: Path, work: Path
) -> tuple[Flooded, Occupancy]:
    """The fairness part on three fresh ``llama-server -np 1``."""
    with ExitStack() as stack:
        nodes = [
            stack.enter_context(
                llama_node(f"n{i}", model, slots=1, extra=("--threads-http", str(HTTP_THREADS)))
            )
            for i in range(shape.nodes)
        ]
        running = stack.enter_context(
            proxy("llamacpp", [(n.name, n.url) for n in nodes], side == "queue-on", work)
        )
        readers = [lambda u=n.url: busy_slots(u) for n in nodes]
        with Occupancy(readers) as occupancy:
            flooded = play_flooded(running.port, shape, seed, FLOOD, CHAT, MODEL, real=True)
        return flooded, occupancy


# -- the scenario ---------------------------------------------------------------------------------


def _say(text: str) -> None:
    print(text, flush=True)


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


@attrs.define
class Parts:
    """Every part's shape for one run of the bench; the real engines' once calibrated."""

    seconds: float
    fair: Fairness
    late: LateBinding
    mixed: Collation
    prio: Fairness
    real: Fairness | None = None

    @staticmethod
    def of(seconds: float) -> Parts:
        return Parts(
            seconds,
            Fairness(seconds=seconds),
            LateBinding(seconds=seconds),
            Collation(seconds=seconds),
            # The chats alone first, for the high key's time on an idle fleet.
            Fairness(seconds=seconds, idle=min(10.0, seconds / 2)),
        )


def _fair_part(results: Results, parts: Parts, side: str, r: int, seed: int, sub: Path) -> None:
    shape = parts.fair
    flooded, busy = run_flooded(side, shape, seed, FLOOD, CHAT, sub)
    _fairness(results, "fair", side, r, flooded, FLOOD, CHAT)
    _occupancy(results, "fair", side, r, busy, shape.nodes * shape.slots, flooded.window)


def _late_part(results: Results, parts: Parts, side: str, r: int, seed: int, sub: Path) -> None:
    shape = parts.late
    asks = arrivals(seed, shape)
    outcomes, busy = run_late(side, shape, asks, sub)
    _late(results, side, r, outcomes, shape, asks)
    _occupancy(results, "late", side, r, busy, shape.nodes * shape.slots, (0, shape.seconds))


def _collation_part(
    results: Results, parts: Parts, side: str, r: int, seed: int, sub: Path
) -> None:
    shape = parts.mixed
    played = run_collation(side, shape, seed, sub)
    _collation(results, side, r, played, shape)
    _occupancy(results, "coll", side, r, played.occupancy, shape.boxes, (0, shape.seconds))


def _priority_part(results: Results, parts: Parts, side: str, r: int, seed: int, sub: Path) -> None:
    shape = parts.prio
    flooded, busy = run_flooded(side, shape, seed, LOW, HIGH, sub)
    _priority(results, side, r, flooded, shape)
    _occupancy(results, "prio", side, r, busy, shape.nodes * shape.slots, flooded.window)


def _real_part(results: Results, parts: Parts, side: str, r: int, seed: int, sub: Path) -> None:
    if parts.real is None:
        parts.real = _calibrated(results, parts.seconds)
    shape = parts.real
    flooded, busy = run_real(side, shape, seed, model_path(), sub)
    _fairness(results, "real", side, r, flooded, FLOOD, CHAT)
    _occupancy(results, "real", side, r, busy, shape.nodes * shape.slots, flooded.window)


PART_RUNNERS: dict[str, Callable[[Results, Parts, str, int, int, Path], None]] = {
    "fairness": _fair_part,
    "late-binding": _late_part,
    "collation": _collation_part,
    "priority": _priority_part,
    "real": _real_part,
}


def run(plan: Plan, results: Results, work: Path, names: Sequence[str]) -> None:
    """Every round: each part's same requests through both sides, fresh engines each; the
    real-engine part once, in the first round."""
    parts = Parts.of(plan.contention_seconds)
    _say(
        f"contention: {parts.seconds:g} s per part and side "
        f"({', '.join(plan.contention_parts)}); the queue on against [queue] enabled = false, "
        "the same requests"
    )
    for r in range(plan.rounds):
        seed = plan.contention_seed + r
        for part in plan.contention_parts:
            if part == "real" and r > 0:
                continue
            for side in names:
                sub = work / f"contention-{part}-{side}-{r}"
                sub.mkdir()
                try:
                    PART_RUNNERS[part](results, parts, side, r, seed, sub)
                except (RuntimeError, OSError) as error:
                    results.note(f"contention round {r + 1} {part} {side} failed: {error}")


def _calibrated(results: Results, seconds: float) -> Fairness:
    shape, probes = real_shape(seconds, model_path())
    low, high = shape.flood_tokens
    measured = ", ".join(f"{tokens} tokens in {took:.2f} s" for tokens, took in probes)
    results.note(
        f"contention, real engines: three probe servers generating at once: {measured}; "
        f"flood answers of {low}-{high} tokens"
    )
    return shape


def _occupancy(
    results: Results,
    part: str,
    side: str,
    r: int,
    occupancy: Occupancy,
    places: int,
    window: tuple[float, float],
) -> None:
    """The share of the engines' places busy over the run's window (seconds from its start),
    and the most answers any engine held waiting."""
    busy = occupancy.busy(*window)
    share = None if busy is None else busy / places
    results.put(f"ct_{part}_busy", side, r, share)
    results.put(f"ct_{part}_engine_waiting", side, r, occupancy.most_waiting())
    _say(
        f"    places busy {'—' if share is None else f'{share:.0%}'} of {places} on average "
        f"over {window[0]:g}-{window[1]:g} s; at most {occupancy.most_waiting()} waited in "
        "one engine"
    )


def _record(
    results: Results,
    side: str,
    r: int,
    figures: Figures,
    panel: tuple[str, Sequence[Outcome]],
    outcomes: Sequence[Outcome],
    what: str,
) -> None:
    """A run's figures into the table, the TTFTs of the plot's ``panel`` (its title and its
    requests) into the plot, and a note of any of ``outcomes`` that failed."""
    for metric, value in figures.items():
        results.put(metric, side, r, value)
    title, plotted = panel
    results.sample(f"contention, {title} (ms)", side, ttfts(plotted))
    failed = [o for o in outcomes if o.failed]
    if failed:
        errors = sorted({o.error for o in failed})
        results.note(f"contention round {r + 1} {what} {side}: {len(failed)} failed ({errors[:3]})")


def _fairness(
    results: Results,
    part: str,
    side: str,
    r: int,
    run: Flooded,
    flooder: Caller,
    chatter: Caller,
) -> None:
    figures = fairness_figures(run.outcomes, flooder, chatter, run.flood_end, part)
    what = "real engines" if part == "real" else "fairness"
    chats = of(run.outcomes, chatter)
    panel = (f"{what}: the second caller's TTFT", chats)
    _record(results, side, r, figures, panel, run.outcomes, what)
    _say(
        f"  round {r + 1} {what} {side}: chats TTFT p50 {_ms(figures[f'ct_{part}_chat_p50_ms'])}"
        f" / p95 {_ms(figures[f'ct_{part}_chat_p95_ms'])} ms "
        f"({len(chats)}, {figures[f'ct_{part}_chat_waited']:.0f} queued), flood "
        f"{figures[f'ct_{part}_flood_done']:.0f} completed in "
        f"{run.flood_end - run.flood_start:g} s, {figures[f'ct_{part}_failed']:.0f} failed"
    )


def _late(
    results: Results,
    side: str,
    r: int,
    outcomes: Sequence[Outcome],
    shape: LateBinding,
    asks: Sequence[Ask],
) -> None:
    figures = late_figures(outcomes)
    panel = ("late binding: TTFT", outcomes)
    _record(results, side, r, figures, panel, outcomes, "late binding")
    served = Counter(o.node for o in outcomes if o.ok)
    _say(
        f"  round {r + 1} late binding {side}: {len(asks)} requests at "
        f"{shape.load * capacity(shape):.2f}/s, TTFT mean {_ms(figures['ct_late_mean_ms'])}, "
        f"p50 {_ms(figures['ct_late_p50_ms'])} / "
        f"p99 {_ms(figures['ct_late_p99_ms'])} ms, {figures['ct_late_done']:.0f} completed, "
        f"{figures['ct_late_failed']:.0f} failed; answers per node {dict(sorted(served.items()))}"
    )


def _collation(results: Results, side: str, r: int, run: Mixed, shape: Collation) -> None:
    loads = sum(run.loads.values())
    figures = collation_figures(run.outcomes, loads, sum(run.evictions.values()), shape)
    panel = ("collation: TTFT", run.outcomes)
    _record(results, side, r, figures, panel, run.outcomes, "collation")
    _say(
        f"  round {r + 1} collation {side}: {loads} loads ({run.loads}), "
        f"{figures['ct_coll_done']:.0f} completed, TTFT p50 {_ms(figures['ct_coll_ttft_p50_ms'])}"
        f" / p99 {_ms(figures['ct_coll_ttft_p99_ms'])} / max {_ms(figures['ct_coll_ttft_max_ms'])}"
        f" ms, longest queued {_ms(figures['ct_coll_queued_max_ms'])} ms, "
        f"{figures['ct_coll_failed']:.0f} failed"
    )


def _priority(results: Results, side: str, r: int, run: Flooded, shape: Fairness) -> None:
    figures = priority_figures(run.outcomes, run.flood_start, run.flood_end, shape)
    beside = [o for o in of(run.outcomes, HIGH) if o.sent >= run.flood_start]
    panel = ("priority: the high key's TTFT beside the flood", beside)
    _record(results, side, r, figures, panel, run.outcomes, "priority")
    _say(
        f"  round {r + 1} priority {side}: high's TTFT p95 idle "
        f"{_ms(figures['ct_prio_idle_p95_ms'])} ms, beside the low flood "
        f"{_ms(figures['ct_prio_high_p95_ms'])} ms; flood {figures['ct_prio_flood_done']:.0f} "
        f"completed, {figures['ct_prio_failed']:.0f} failed"
    )
