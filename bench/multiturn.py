"""The multi-turn bench: seeded conversations through fleet mode over three real llama-servers,
with prefix affinity on and off (docs/fleet-scheduling.md; bench/README.md "Multi-turn").

Per round, per side: three fresh ``llama-server`` processes (so no cache carries over from the
other side), a fresh ``twistd -n nvpair-proxy --fleet FILE`` in front of them (the llama.cpp
facade, an admin listener, ``[scheduling] affinity`` as the side says), the same conversations
played through it (:mod:`bench.chatclient`), then each node's own prompt-token counters
(``/metrics``) and the proxy's ``/status``. With ``--multiturn-correction`` a third run per round
keeps affinity on with one node's prompt cache off (``--cache-ram 0 -np 1``), to show what the
proxy's correction from the engines' reports does (not judged).

Before the rounds, one more server (stopped before the first side) calibrates: how many
characters a token is in this tokenizer, how long reading 2,000 tokens takes, and how many tokens
each user message of the round really has.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from random import Random
from typing import TYPE_CHECKING

import attrs

from bench import chatclient
from bench.chatresults import SideSummary, Turn, side_table, summarize
from bench.conversations import ChatMix, Conversation, chat_mix, fitted, user_text
from bench.llamanodes import (
    MODEL,
    SLOT_CONTEXT,
    LlamaNode,
    llama_node,
    model_path,
    prompt_counters,
    read_time_ms,
    token_count,
)
from bench.procs import TWISTD, free_port, process, wait_until
from bench.statuswatch import StatusWatch, Suspension, first_suspensions, node_caches

if TYPE_CHECKING:
    from bench.scenarios import Plan, Results

SIDES = ("affinity-off", "affinity-on")
#: The correction run: affinity on, one node's prompt cache off (``--cache-ram 0 -np 1``).
CORRECTION = "no-cache-node"
NODES = ("n0", "n1", "n2")
UNCACHED = NODES[0]
#: The tokens of the history whose read time is measured and printed.
HISTORY_TOKENS = 2000


#: The shared-prefix part's system prompt, in tokens (a coding assistant's is about this long).
SHARED_TOKENS = 2000
#: The shared-prefix part's turns and context per slot: the system prompt and four turns of
#: 300-token messages fit the model's 4,096 positions; six would not.
SHARED_TURNS = 4
SHARED_SLOT_CONTEXT = 4096


@attrs.frozen
class Calibration:
    chars_per_token: float
    read_tokens: int
    read_ms: tuple[float, ...]
    #: The shared-prefix part's system prompt, :data:`SHARED_TOKENS` tokens give or take 2 %.
    system: str = ""


def calibrate(model: Path) -> Calibration:
    """Characters per token of the words the messages are made of, the time one server takes to
    read a 2,000-token history (twice; its cache bypassed), and the shared-prefix part's system
    prompt fitted to its length by the engine's own tokenizer."""
    with llama_node("probe", model) as probe:
        sample = user_text(Random(0), 3000, 1.0)
        chars_per_token = len(sample) / token_count(probe.url, sample)
        history = user_text(Random(1), HISTORY_TOKENS, chars_per_token)
        reads = [read_time_ms(probe.url, f"{i} {history}") for i in range(2)]
        system = fitted(
            user_text(Random(2), SHARED_TOKENS, chars_per_token),
            lambda text: token_count(probe.url, text),
            round(SHARED_TOKENS * 0.98),
            round(SHARED_TOKENS * 1.02),
        )
    return Calibration(chars_per_token, reads[0][0], tuple(ms for _, ms in reads), system)


def fit_messages(
    model: Path, rounds: Sequence[Sequence[Conversation]], mix: ChatMix
) -> tuple[list[tuple[Conversation, ...]], list[list[int]]]:
    """Every round's conversations with each user message brought into the mix's token range
    by the engine's own tokenizer, and every message's token count."""
    low, high = mix.user_tokens
    with llama_node("probe", model) as probe:

        def count(text: str) -> int:
            return token_count(probe.url, text)

        fits = [
            tuple(
                attrs.evolve(c, messages=tuple(fitted(m, count, low, high) for m in c.messages))
                for c in conversations
            )
            for conversations in rounds
        ]
        counts = [[count(m) for c in conversations for m in c.messages] for conversations in fits]
    return fits, counts


def fleet_text(port: int, nodes: Sequence[LlamaNode], affinity: bool) -> str:
    """The fleet file: the llama.cpp facade on ``port``, the nodes, and the affinity switch
    (``affinity-slack`` left at its default)."""
    lines = ["[facades.llamacpp]", f"port = {port}"]
    lines += ["[scheduling]", f"affinity = {'true' if affinity else 'false'}"]
    for node in nodes:
        lines += ["[[nodes]]", f'id = "{node.name}"', "[nodes.engines]", f'llamacpp = "{node.url}"']
    return "\n".join(lines) + "\n"


def _get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


def _all_up(admin: int) -> bool:
    try:
        status = _get_json(f"http://127.0.0.1:{admin}/status")
    except (OSError, ValueError):
        return False
    nodes = status.get("nodes", {}).get("llamacpp", []) if isinstance(status, dict) else []
    return len(nodes) == len(NODES) and all(n.get("state") == "up" for n in nodes)


@attrs.frozen
class Proxy:
    port: int
    admin: int


@contextmanager
def proxy(nodes: Sequence[LlamaNode], affinity: bool, work: Path) -> Iterator[Proxy]:
    """nvpair in fleet mode in front of ``nodes``, once every node is up in its ``/status``."""
    port, admin = free_port(), free_port()
    config = work / "fleet.toml"
    config.write_text(fleet_text(port, nodes, affinity))
    argv = [TWISTD, "--pidfile=", "-n", "nvpair-proxy", "--fleet", str(config)]
    argv += ["--admin-port", str(admin), "--state-dir", str(work / "state")]
    argv += ["--log-level", "warn"]
    with (
        open(work / "proxy.log", "wb") as log,
        process(argv, cwd=work, stdin=subprocess.DEVNULL, stderr=log) as child,
    ):
        wait_until(lambda: child.poll() is not None or _all_up(admin), 60, "every node up")
        if child.poll() is not None:
            raise RuntimeError(f"the proxy exited with {child.returncode} (see {log.name})")
        yield Proxy(port, admin)


@attrs.frozen
class SideRun:
    """One side of a round: every turn, each node's own counters, the proxy's last status."""

    turns: list[Turn]
    counters: dict[str, tuple[int, int]]
    status: object
    seconds: float
    suspensions: list[Suspension] = attrs.field(factory=list)


def run_side(
    side: str,
    conversations: Sequence[Conversation],
    mix: ChatMix,
    model: Path,
    work: Path,
    slot_context: int | None = None,
) -> SideRun:
    """Three fresh servers, a fresh proxy for ``side``, every conversation played through it."""
    affinity = side != "affinity-off"
    with ExitStack() as stack:
        nodes = []
        for name in NODES:
            # The correction run: the node the plain order reaches first (ties go by node id)
            # keeps no prompt cache to speak of, so the most conversations meet the correction.
            uncached = side == CORRECTION and name == UNCACHED
            node = llama_node(
                name,
                model,
                slots=1 if uncached else 2,
                cache_ram_mib=0 if uncached else None,
                slot_context=SLOT_CONTEXT if slot_context is None else slot_context,
            )
            nodes.append(stack.enter_context(node))
        running = stack.enter_context(proxy(nodes, affinity, work))
        watch = StatusWatch(running.admin)
        watch.start()
        started = time.monotonic()
        try:
            turns = chatclient.play(running.port, MODEL, conversations, mix)
        finally:
            watch.stop()
        elapsed = time.monotonic() - started
        counters = {n.name: prompt_counters(n.url) for n in nodes}
        status = _get_json(f"http://127.0.0.1:{running.admin}/status")
    return SideRun(turns, counters, status, elapsed, first_suspensions(watch.readings))


def _say(text: str) -> None:
    print(text, flush=True)


def run(plan: Plan, results: Results, work: Path, names: Sequence[str]) -> None:
    """Every round: the same seeded conversations through each side (and the correction run
    when the plan asks for it), each on fresh engines."""
    mix = ChatMix(conversations=plan.multiturn_conversations)
    sides = [*names, CORRECTION] if plan.multiturn_correction else list(names)
    model = model_path()
    _say(
        f"multi-turn: 3 llama-servers (-np 2, one thread), {mix.conversations} conversations "
        f"of {mix.turns} turns, {mix.user_tokens[0]}-{mix.user_tokens[1]} tokens a message, "
        f"at most {mix.max_tokens} tokens an answer, {mix.think[0]:g}-{mix.think[1]:g} s "
        f"think time, starts {mix.stagger:g} s apart"
    )
    calibration = calibrate(model)
    reads = " / ".join(f"{ms:,.0f}" for ms in calibration.read_ms)
    _say(
        f"  model {model.name}: {calibration.chars_per_token:.3f} characters a token; reading "
        f"a {calibration.read_tokens:,}-token history takes {reads} ms (one thread, no cache)"
    )
    results.put("mt_read_ms", "calibration", 0, min(calibration.read_ms))
    results.note(
        f"multi-turn: a {calibration.read_tokens:,}-token history takes {reads} ms to read "
        f"(one thread, cache bypassed; {calibration.chars_per_token:.3f} characters a token)"
    )
    drawn = [
        chat_mix(plan.multiturn_seed + r, mix, calibration.chars_per_token)
        for r in range(plan.rounds)
    ]
    rounds, counts = fit_messages(model, drawn, mix)
    for r, conversations in enumerate(rounds):
        tokens = counts[r]
        _say(
            f"  round {r + 1} (seed {plan.multiturn_seed + r}): user messages of "
            f"{min(tokens)}-{max(tokens)} tokens (mean {sum(tokens) / len(tokens):.0f}), "
            f"{sum(tokens):,} in all"
        )
        summaries: dict[str, SideSummary] = {}
        for side in sides:
            sub = work / f"multiturn-{side}-{r}"
            sub.mkdir()
            try:
                played = run_side(side, conversations, mix, model, sub)
            except (RuntimeError, OSError) as error:
                results.note(f"multi-turn round {r + 1} {side} failed: {error}")
                continue
            summaries[side] = summarize(played.turns, NODES, played.seconds)
            said = affinity_shown(played.status)
            if said != (side != "affinity-off"):
                results.note(f"multi-turn round {r + 1} {side}: /status says affinity {said}")
            if isinstance(played.status, dict):
                shown = json.dumps(played.status.get("affinity"))
                results.note(f"multi-turn round {r + 1} {side}: /status affinity {shown}")
            _record(results, side, r, summaries[side], played)
            _say(f"  round {r + 1} {side}: done in {played.seconds:.0f} s")
            if side == CORRECTION:
                for line in correction_lines(played):
                    results.note(f"multi-turn round {r + 1} correction: {line}")
        for line in side_table(summaries):
            _say(f"    {line}")
        if plan.multiturn_shared:
            shared = [
                attrs.evolve(
                    c,
                    system=calibration.system,
                    messages=c.messages[:SHARED_TURNS],
                    thinks=c.thinks[: SHARED_TURNS - 1],
                )
                for c in conversations
            ]
            shared_mix = attrs.evolve(mix, turns=SHARED_TURNS)
            _shared_part(results, names, r, shared, shared_mix, model, work)


def _shared_part(
    results: Results,
    sides: Sequence[str],
    r: int,
    conversations: Sequence[Conversation],
    mix: ChatMix,
    model: Path,
    work: Path,
) -> None:
    """The same conversations, each opening with one shared system prompt: what prefix sharing
    across conversations does with affinity off and on (reported, not judged)."""
    summaries: dict[str, SideSummary] = {}
    for side in sides:
        sub = work / f"multiturn-shared-{side}-{r}"
        sub.mkdir()
        try:
            played = run_side(side, conversations, mix, model, sub, SHARED_SLOT_CONTEXT)
        except (RuntimeError, OSError) as error:
            results.note(f"multi-turn shared prefix round {r + 1} {side} failed: {error}")
            continue
        summary = summaries[side] = summarize(played.turns, NODES, played.seconds)
        for metric, value in (
            ("requests", summary.requests),
            ("failed", summary.failed),
            ("ttft_p50_ms", summary.ttft_p50_ms),
            ("ttft_p90_ms", summary.ttft_p90_ms),
            ("evaluated", summary.evaluated),
            ("cached", summary.cached),
            ("busiest_share", summary.busiest_share),
            ("stayed", summary.stayed / summary.followups if summary.followups else None),
        ):
            results.put(f"mts_{metric}", side, r, value)
        _say(f"  round {r + 1} shared prefix {side}: done in {played.seconds:.0f} s")
    for line in side_table(summaries):
        _say(f"    {line}")


def _record(results: Results, side: str, r: int, summary: SideSummary, played: SideRun) -> None:
    results.put("mt_requests", side, r, summary.requests)
    results.put("mt_failed", side, r, summary.failed)
    results.put("mt_ttft_p50_ms", side, r, summary.ttft_p50_ms)
    results.put("mt_ttft_p90_ms", side, r, summary.ttft_p90_ms)
    results.put("mt_evaluated", side, r, summary.evaluated)
    results.put("mt_cached", side, r, summary.cached)
    results.put("mt_least", side, r, summary.least)
    results.put("mt_engine_evaluated", side, r, sum(e for e, _ in played.counters.values()))
    results.put("mt_engine_cached", side, r, sum(c for _, c in played.counters.values()))
    results.put("mt_busiest_share", side, r, summary.busiest_share)
    results.put(
        "mt_stayed", side, r, summary.stayed / summary.followups if summary.followups else None
    )
    results.put("mt_in_flight", side, r, summary.in_flight)
    for name, tokens in summary.nodes.items():
        results.put(f"mt_node_requests:{name}", side, r, tokens.requests)
    ttfts = [t.ttft_ms for t in played.turns if t.ok and t.ttft_ms is not None]
    results.sample("multi-turn: time to first token (ms)", side, ttfts)
    statuses = ", ".join(f"{k}: {v}" for k, v in summary.statuses.items())
    results.note(f"multi-turn round {r + 1} {side}: statuses {statuses}")
    if summary.failed:
        errors = sorted({t.error for t in played.turns if not t.ok})
        results.note(f"multi-turn round {r + 1} {side}: {summary.failed} failed ({errors[:3]})")


def affinity_shown(status: object) -> bool | None:
    """Whether the proxy's ``/status`` says affinity is on (None: it does not say)."""
    affinity = status.get("affinity") if isinstance(status, dict) else None
    enabled = affinity.get("enabled") if isinstance(affinity, dict) else None
    return enabled if isinstance(enabled, bool) else None


def correction_lines(played: SideRun) -> list[str]:
    """Per node: its answers' evaluated and cached tokens, its own counters, and what the
    proxy's ``/status`` said of its cache at the end; then when each suspension began."""
    summary = summarize(played.turns, NODES)
    caches = node_caches(played.status)
    lines = []
    for name in NODES:
        tokens = summary.nodes[name]
        evaluated, cached = played.counters.get(name, (0, 0))
        uncached = " (--cache-ram 0 -np 1)" if name == UNCACHED else ""
        lines.append(
            f"{name}{uncached}: {tokens.requests} answers, their timings {tokens.evaluated:,} "
            f"evaluated / {tokens.cached:,} from cache; its /metrics {evaluated:,} / "
            f"{cached:,}; /status cache at the end {json.dumps(caches.get(name))}"
        )
    for suspension in played.suspensions:
        lines.append(
            f"{suspension.node}: affinity suspended {suspension.seconds:.0f} s into the run, "
            f"/status then {json.dumps(suspension.cache)}"
        )
    if not played.suspensions:
        lines.append("no node's affinity was suspended during the run")
    return lines
