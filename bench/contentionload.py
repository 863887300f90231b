"""Pure: the contention bench's callers, workloads and fleets, and the summary of what each
caller saw (bench/README.md, "The fleet's queue").

Four parts, each played twice per round through the same proxy with ``[queue] enabled`` true and
false (docs/fleet-scheduling.md#the-queue), the same requests both times:

- **fairness** — one caller keeps a flood of requests in flight, another sends one short chat
  every few seconds: how long the second waits for its first token;
- **late binding** — one open-loop stream of requests of mixed lengths at a share of the
  fleet's capacity, one node slower than the others: the tail of the time to first token;
- **collation** — small boxes that hold one model at a time, a closed loop of requests for a
  few models in a random mix: how many loads, and how long any request waited;
- **priority** — the fairness flood from a ``low`` key, the chats from a ``high`` one, after a
  spell of the chats alone on the idle fleet.

The same seed gives the same requests, byte for byte. Nothing here does I/O: :mod:`bench.contention`
sends the requests and measures the answers.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Sequence

import attrs

from bench.targets import percentile

SIDES = ("queue-off", "queue-on")
PARTS = ("fairness", "late-binding", "collation", "priority", "real")


@attrs.frozen
class Caller:
    """A key of the key file: its name, its queue priority, and the secret it presents."""

    name: str
    priority: str = "normal"

    @property
    def secret(self) -> str:
        return f"nvp_bench_{self.name}_secret"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.secret.encode()).hexdigest()


FLOOD = Caller("flood")
CHAT = Caller("chat")
LOW = Caller("batch", "low")
HIGH = Caller("boss", "high")
MIX = Caller("team")
CALLERS = (FLOOD, CHAT, LOW, HIGH, MIX)


def keys_text(callers: Sequence[Caller] = CALLERS) -> str:
    """The key file: one key per caller, by the SHA-256 of its secret, with its priority."""
    return "".join(
        f'[[keys]]\nname = "{c.name}"\nsha256 = "{c.sha256}"\npriority = "{c.priority}"\n'
        for c in callers
    )


def fleet_text(
    engine: str,
    port: int,
    nodes: Sequence[tuple[str, str]],
    queue: bool,
    collate: float | None = None,
) -> str:
    """The fleet file: ``engine``'s facade on ``port`` over ``nodes`` (id, URL), the queue on or
    off, and ``[access]`` with a network no caller is on, so a loopback caller presenting a key
    counts as that key (docs/lan.md) while every caller here is on this machine."""
    lines = [f"[facades.{engine}]", f"port = {port}", "[queue]"]
    lines.append(f"enabled = {'true' if queue else 'false'}")
    if collate is not None:
        lines.append(f'collate = "{collate:g}s"')
    lines += ["[access]", 'networks = ["192.0.2.0/24"]', 'keys = "keys.toml"']
    for name, url in nodes:
        lines += ["[[nodes]]", f'id = "{name}"', "[nodes.engines]", f'{engine} = "{url}"']
    return "\n".join(lines) + "\n"


def chat_body(model: str, tokens: int, text: str, real: bool = False) -> bytes:
    """A streamed chat of one user message asking for ``tokens`` tokens. A real llama-server is
    told to ignore the end token: random weights sample it at any point."""
    body: dict[str, object] = {
        "model": model,
        "stream": True,
        "max_tokens": tokens,
        "messages": [{"role": "user", "content": text}],
    }
    if real:
        body["ignore_eos"] = True
    return json.dumps(body).encode()


# -- the parts' shapes ------------------------------------------------------------------------


@attrs.frozen
class Fairness:
    """One caller floods, another chats (also the priority part's shape).

    :param seconds: how long the flood runs and the chats are sent.
    :param nodes: simulated llama.cpp nodes, ``slots`` each.
    :param flood: requests the first caller keeps in flight.
    :param flood_tokens: the least and most tokens of a flood answer (uniform between).
    :param chat_every: seconds between the second caller's chats.
    :param chat_tokens: tokens of a chat's answer.
    :param token_seconds: seconds per generated token.
    :param idle: seconds of chats alone on the idle fleet first (the priority part's baseline).
    :param idle_every: seconds between those.
    """

    seconds: float = 60.0
    nodes: int = 3
    slots: int = 2
    flood: int = 24
    flood_tokens: tuple[int, int] = (75, 125)
    chat_every: float = 2.0
    chat_tokens: int = 5
    token_seconds: float = 0.02
    idle: float = 0.0
    idle_every: float = 1.0

    @property
    def service(self) -> float:
        """Seconds of a flood answer on average: its tokens, the role and finish chunks."""
        low, high = self.flood_tokens
        return ((low + high) / 2 + 2) * self.token_seconds


def flood_lengths(seed: int, shape: Fairness, worker: int) -> tuple[int, ...]:
    """The tokens of each request one flood worker sends in turn: more than it can send in
    ``shape.seconds`` (it sends the next when one ends, and none is shorter than the least)."""
    rng = random.Random(f"{seed}:flood:{worker}")
    low, high = shape.flood_tokens
    count = math.ceil(shape.seconds / (low * shape.token_seconds)) + 2
    return tuple(rng.randint(low, high) for _ in range(count))


def chat_times(shape: Fairness) -> tuple[float, ...]:
    """When each chat is sent (seconds from the start): the idle spell's first, then one every
    ``chat_every`` while the flood runs, the first one interval in."""
    idle = [i * shape.idle_every for i in range(math.floor(shape.idle / shape.idle_every))]
    count = math.floor(shape.seconds / shape.chat_every)
    flood = [shape.idle + (i + 1) * shape.chat_every for i in range(count - 1)]
    return tuple(round(t, 6) for t in idle + flood)


@attrs.frozen
class LateBinding:
    """An open-loop stream at a share of the fleet's capacity, one node slower.

    :param load: the arrival rate as a share of :func:`capacity`.
    :param tokens: the least and most tokens of an answer (log-uniform between).
    :param slow: how many times slower the last node generates.
    """

    seconds: float = 60.0
    nodes: int = 3
    slots: int = 2
    load: float = 0.85
    tokens: tuple[int, int] = (10, 150)
    token_seconds: float = 0.02
    slow: float = 3.0

    @property
    def mean_tokens(self) -> float:
        low, high = self.tokens
        return (high - low) / math.log(high / low)


def capacity(shape: LateBinding) -> float:
    """Answers a second the fleet can give at most: every slot busy all the time, a fast slot
    answering in the mean answer's time, a slow one ``slow`` times that."""
    answer = (shape.mean_tokens + 2) * shape.token_seconds
    fast = (shape.nodes - 1) * shape.slots / answer
    return fast + shape.slots / (answer * shape.slow)


@attrs.frozen
class Ask:
    """One open-loop request: when it is sent (seconds from the start), its answer's tokens,
    its model."""

    at: float
    tokens: int
    model: str = ""


def arrivals(seed: int, shape: LateBinding) -> tuple[Ask, ...]:
    """Poisson arrivals at ``shape.load`` of :func:`capacity` for ``shape.seconds``, each
    answer's length log-uniform."""
    rng = random.Random(f"{seed}:late")
    rate = shape.load * capacity(shape)
    low, high = shape.tokens
    out: list[Ask] = []
    at = rng.expovariate(rate)
    while at < shape.seconds:
        tokens = round(math.exp(rng.uniform(math.log(low), math.log(high))))
        out.append(Ask(round(at, 6), tokens))
        at += rng.expovariate(rate)
    return tuple(out)


@attrs.frozen
class Collation:
    """Small Ollama boxes and a closed loop over a few models.

    :param workers: requests kept in flight (each sends its next when one ends): the queue is
        never empty, the fleet saturated.
    :param boxes: simulated Ollama nodes, each holding one model in memory at a time and
        serving one request at once (``OLLAMA_NUM_PARALLEL`` 1, the default).
    :param models: every box lists all of them; each request names one at random.
    :param tokens: tokens of every answer (one service time).
    :param load_delay: seconds a box takes to load a model.
    :param collate: the queue's ``collate``.
    """

    seconds: float = 60.0
    workers: int = 6
    boxes: int = 2
    models: tuple[str, ...] = ("llama3.1:8b", "qwen2.5:7b", "mistral:7b")
    tokens: int = 50
    token_seconds: float = 0.02
    load_delay: float = 3.0
    collate: float = 10.0

    @property
    def service(self) -> float:
        """Seconds one answer takes once its model is in memory (its tokens, the finish)."""
        return (self.tokens + 1) * self.token_seconds

    @property
    def bound(self) -> float:
        """The longest any request should wait in the queue: ``collate`` plus two service
        times."""
        return self.collate + 2 * self.service


def mix_models(seed: int, shape: Collation, worker: int) -> tuple[str, ...]:
    """The model of each request one collation worker sends in turn (uniform at random)."""
    rng = random.Random(f"{seed}:mix:{worker}")
    count = math.ceil(shape.seconds / shape.service) + 2
    return tuple(rng.choice(shape.models) for _ in range(count))


# -- what the client saw ----------------------------------------------------------------------

CUT = "cut at the end of the run"
"""A request still waiting or streaming when its run ended: neither completed nor failed."""


@attrs.frozen
class Outcome:
    """One request, as its client saw it.

    :param caller: the key it presented.
    :param sent: seconds from the run's start to sending it.
    :param status: the HTTP status; None when no answer came.
    :param ttft_ms: from starting to connect to the first token; None when none came.
    :param ended: seconds from the run's start to the end of its answer (or its failure).
    :param queued_ms: the proxy's ``X-Nvpair-Queued-Ms``; None when it did not wait there.
    :param node: the node that answered (``X-Nvpair-Node``).
    :param model: the model it asked for.
    :param error: why it failed, or :data:`CUT`.
    """

    caller: str
    sent: float
    status: int | None
    ttft_ms: float | None
    ended: float
    queued_ms: float | None = None
    node: str = ""
    model: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error and self.ttft_ms is not None

    @property
    def cut(self) -> bool:
        return self.error == CUT

    @property
    def failed(self) -> bool:
        return not self.ok and not self.cut


@attrs.frozen
class CallerSummary:
    """One caller's requests in one run.

    :param completed: answered in full (200, every chunk) by ``until``.
    :param failed: not answered in full, the cut ones aside.
    :param cut: still running when the run ended.
    :param waited: answers that carried ``X-Nvpair-Queued-Ms``.
    :param queued_max_ms: the longest of those.
    """

    requests: int
    completed: int
    failed: int
    cut: int
    ttft_mean_ms: float | None
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    ttft_p99_ms: float | None
    ttft_max_ms: float | None
    waited: int
    queued_max_ms: float | None


def ttfts(outcomes: Sequence[Outcome]) -> list[float]:
    """The times to first token of the answers in full."""
    return [o.ttft_ms for o in outcomes if o.ok and o.ttft_ms is not None]


def summarize(
    outcomes: Sequence[Outcome], until: float | None = None, since: float = 0.0
) -> CallerSummary:
    """``outcomes`` (one caller's, or any set) of those sent at ``since`` or later; completed
    counts those that ended by ``until`` (None: whenever)."""
    chosen = [o for o in outcomes if o.sent >= since]
    ok = [o for o in chosen if o.ok]
    times = ttfts(ok)
    queued = [o.queued_ms for o in chosen if o.queued_ms is not None]
    return CallerSummary(
        requests=len(chosen),
        completed=sum(1 for o in ok if until is None or o.ended <= until),
        failed=sum(1 for o in chosen if o.failed),
        cut=sum(1 for o in chosen if o.cut),
        ttft_mean_ms=sum(times) / len(times) if times else None,
        ttft_p50_ms=percentile(times, 50) if times else None,
        ttft_p95_ms=percentile(times, 95) if times else None,
        ttft_p99_ms=percentile(times, 99) if times else None,
        ttft_max_ms=max(times) if times else None,
        waited=len(queued),
        queued_max_ms=max(queued) if queued else None,
    )


def of(outcomes: Sequence[Outcome], caller: Caller) -> list[Outcome]:
    return [o for o in outcomes if o.caller == caller.name]


# -- each part's figures, as the bench's table keeps them --------------------------------------

Figures = dict[str, float | None]


def fairness_figures(
    outcomes: Sequence[Outcome], flooder: Caller, chatter: Caller, until: float, part: str
) -> Figures:
    """The chatter's TTFT and the flood's completed requests (by ``until``, the end of its
    window); ``part`` names the metrics (``fair``, or ``real`` for the real engines)."""
    chats = summarize(of(outcomes, chatter))
    flood = summarize(of(outcomes, flooder), until=until)
    return {
        f"ct_{part}_chat_p50_ms": chats.ttft_p50_ms,
        f"ct_{part}_chat_p95_ms": chats.ttft_p95_ms,
        f"ct_{part}_chat_waited": chats.waited,
        f"ct_{part}_flood_done": flood.completed,
        f"ct_{part}_flood_p50_ms": flood.ttft_p50_ms,
        f"ct_{part}_failed": chats.failed + flood.failed,
    }


def late_figures(outcomes: Sequence[Outcome]) -> Figures:
    seen = summarize(outcomes)
    return {
        "ct_late_requests": seen.requests,
        "ct_late_mean_ms": seen.ttft_mean_ms,
        "ct_late_p50_ms": seen.ttft_p50_ms,
        "ct_late_p99_ms": seen.ttft_p99_ms,
        "ct_late_done": seen.completed,
        "ct_late_failed": seen.failed,
        "ct_late_waited": seen.waited,
    }


def collation_figures(
    outcomes: Sequence[Outcome], loads: int, evictions: int, shape: Collation
) -> Figures:
    """The boxes' loads beside what the client saw; the longest wait in the queue (0 when no
    request waited there) and its bound."""
    seen = summarize(outcomes)
    return {
        "ct_coll_loads": loads,
        "ct_coll_evictions": evictions,
        "ct_coll_done": seen.completed,
        "ct_coll_failed": seen.failed,
        "ct_coll_ttft_p50_ms": seen.ttft_p50_ms,
        "ct_coll_ttft_p99_ms": seen.ttft_p99_ms,
        "ct_coll_ttft_max_ms": seen.ttft_max_ms,
        "ct_coll_queued_max_ms": seen.queued_max_ms or 0.0,
        "ct_coll_bound_ms": shape.bound * 1000,
    }


def priority_figures(
    outcomes: Sequence[Outcome], flood_start: float, until: float, shape: Fairness
) -> Figures:
    """The high key's TTFT p95 alone on the idle fleet (sent before ``flood_start``) and beside
    the low key's flood (sent after), one flood answer's time, the flood's completed requests by
    ``until``."""
    mine = of(outcomes, HIGH)
    idle = summarize([o for o in mine if o.sent < flood_start])
    flooded = summarize(mine, since=flood_start)
    flood = summarize(of(outcomes, LOW), until=until)
    return {
        "ct_prio_idle_p95_ms": idle.ttft_p95_ms,
        "ct_prio_high_p95_ms": flooded.ttft_p95_ms,
        "ct_prio_service_ms": shape.service * 1000,
        "ct_prio_flood_done": flood.completed,
        "ct_prio_failed": idle.failed + flooded.failed + flood.failed,
    }
