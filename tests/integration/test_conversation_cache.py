"""Conversations go where their cache is, with simulated llama.cpp nodes (issue 23 items 2 and
3; docs/fleet-scheduling.md#conversations-go-where-their-cache-is).

Through ``twistd -n nvpair-proxy --fleet`` with an admin listener and the openai SDK, in front
of three simulated ``llama-server``s with one slot each, whose prompt cache is llama-server's
(docs/fleet-scheduling.md#simulated-engines): ``a`` and ``b`` keep prompts in RAM as well,
``c`` does not (``--cache-ram 0``). Six conversations start at once, two on each node; then
each says something ten times more, in turn. Each later turn goes back to its conversation's
node: ``a`` and ``b`` find the turn before in cache, every time, though two conversations
share their one slot; ``c``'s two evict each other, so it finds (almost) nothing, and after
its 20 routed answers its affinity is suspended. ``/status``, ``/metrics`` and the status page
say so. With affinity off, the later turns go by the plain order instead.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import openai
import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.threads import deferToThread

from nvpair.control.affinity import ROUTED_WINDOW
from nvpair.sim import SimEngine
from nvpair.sim.generation import chat_words
from tests.integration.browser import Browser
from tests.integration.harness import ProxyProcess, free_port, log_problems, write_fleet
from tests.integration.test_fleet import eventually
from tests.integration.test_fleet_operator import admin_get
from tests.integration.test_fleet_schedules import started, stopped
from tests.integration.test_metrics_endpoint import labels, scrape
from tests.integration.test_status_page import (
    browser,
    every_node_up,
    keep_screenshot,
    page_and_screenshot,
)

pytestmark = pytest.mark.integration

__all__ = ["browser"]  # the module's headless Chromium, a fixture of test_status_page

NODES = ("a", "b", "c")
#: Conversations started at once: two a node.
CONVERSATIONS = 6
#: Turns after the first, per conversation: ``c``'s two conversations give it exactly the
#: routed answers that judge it.
LATER_TURNS = ROUTED_WINDOW // 2
#: How long every node holds its answers while the conversations start, so that all six are
#: in flight together and the order spreads them by load.
HOLD = 2.0


class Turn(NamedTuple):
    node: str
    prompt_tokens: int
    cached_tokens: int


def ask(port: int, history: list[dict[str, str]]) -> tuple[Turn, str]:
    """One turn through the proxy's llama.cpp facade with the openai SDK (blocking: run it in
    a thread); the turn and the reply."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    with client:
        raw = client.chat.completions.with_raw_response.create(
            model="tiny",
            messages=history,  # type: ignore[arg-type]
        )
    completion = raw.parse()
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    turn = Turn(
        raw.headers["x-nvpair-node"],
        usage.prompt_tokens,
        usage.prompt_tokens_details.cached_tokens or 0,
    )
    return turn, completion.choices[0].message.content or ""


class Conversation:
    """One conversation: its history, and each turn's node and cache report."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.history: list[dict[str, str]] = []
        self.turns: list[Turn] = []

    @property
    def node(self) -> str:
        """Where its first turn went."""
        return self.turns[0].node

    async def say(self, port: int) -> Turn:
        # Each conversation's words are its own from the first: two share no prefix.
        text = f"c{self.number} says thing {len(self.turns)} now"
        self.history.append({"role": "user", "content": text})
        turn, reply = await deferToThread(ask, port, list(self.history))
        self.history.append({"role": "assistant", "content": reply})
        self.turns.append(turn)
        return turn


def fleet_nodes() -> list[SimEngine]:
    """``a`` and ``b`` with the RAM prompt cache (llama-server's default), ``c`` without: one
    slot each."""
    return started(
        SimEngine(reactor, "llamacpp", models=["tiny"], node="a", parallel=1),
        SimEngine(reactor, "llamacpp", models=["tiny"], node="b", parallel=1),
        SimEngine(reactor, "llamacpp", models=["tiny"], node="c", cache_ram=0, parallel=1),
    )


@contextlib.asynccontextmanager
async def three_nodes(
    tmp_path: Path, affinity: bool = True, *options: str
) -> AsyncIterator[tuple[ProxyProcess, int, int, list[SimEngine]]]:
    """The proxy's llama.cpp facade over ``a``, ``b`` and ``c``, with its admin listener (and
    ``options``), once every node is up; yields the proxy, the facade's port, the admin port
    and the sims."""
    sims = fleet_nodes()
    port, admin = free_port(), free_port()
    fleet = write_fleet(tmp_path / "fleet.toml", port, {s.node: s.url for s in sims}, "llamacpp")
    with fleet.open("a") as text:
        text.write(f"[scheduling]\naffinity = {str(affinity).lower()}\n")
    try:
        async with every_node_up(tmp_path, fleet, admin, *options) as proxy:
            yield proxy, port, admin, sims
            assert log_problems(proxy) == []
    finally:
        await stopped(sims)


async def start(port: int, sims: Sequence[SimEngine]) -> list[Conversation]:
    """Six conversations' first turns at once, every node holding its answers meanwhile: each
    node is busier than the next when a turn is placed, so each gets two."""
    conversations = [Conversation(n) for n in range(CONVERSATIONS)]
    for sim in sims:
        sim.faults.header_delay = HOLD
    try:
        await gatherResults([Deferred.fromCoroutine(c.say(port)) for c in conversations])
    finally:
        for sim in sims:
            sim.faults.header_delay = 0.0
    assert Counter(c.node for c in conversations) == {node: 2 for node in NODES}
    assert all(c.turns[0].cached_tokens == 0 for c in conversations)
    return conversations


async def go_on(port: int, conversations: Sequence[Conversation]) -> None:
    """Each conversation says something :data:`LATER_TURNS` times more, in turn."""
    for _ in range(LATER_TURNS):
        for conversation in conversations:
            await conversation.say(port)


def least_recent(dispatched: Sequence[str]) -> str:
    """Of the nodes, the one dispatched to least recently, given dispatches in order (each node
    among them): where the plain order sends a request when all are idle
    (docs/fleet-scheduling.md#ties-spread)."""
    latest = {node: index for index, node in enumerate(dispatched)}
    return min(NODES, key=latest.__getitem__)


def served(conversations: Sequence[Conversation]) -> dict[str, list[Turn]]:
    """Every turn, by the node that answered it."""
    by_node: dict[str, list[Turn]] = {node: [] for node in NODES}
    for conversation in conversations:
        for turn in conversation.turns:
            by_node[turn.node].append(turn)
    return by_node


async def caches(admin: int, answers: int) -> dict[str, Any]:
    """Each node's ``cache`` in ``/status``, once ``answers`` answers have been noted."""
    seen: dict[str, Any] = {}

    async def noted() -> bool:
        _, status = await admin_get(admin, "/status")
        seen.clear()
        seen.update({n["id"]: n["cache"] for n in status["nodes"]["llamacpp"]})
        return sum(int(c["answers"]) for c in seen.values() if c) == answers

    await eventually(noted, f"{answers} answers noted")
    return seen


@pytest_twisted.ensureDeferred
async def test_each_turn_goes_back_to_its_node_and_a_node_that_keeps_nothing_is_suspended(
    tmp_path: Path,
) -> None:
    async with three_nodes(tmp_path) as (_proxy, port, admin, sims):
        conversations = await start(port, sims)
        # c's two first turns ran at once: its one slot holds whichever came last. Only that
        # conversation, if it is the first of the two to go on, finds its turn before there.
        first_on_c = next(c for c in conversations if c.node == "c")
        kept = sims[2].prompts.kept(0) == tuple(chat_words(first_on_c.history[:1]))
        await go_on(port, conversations)
        for conversation in conversations:
            turns = conversation.turns
            assert [t.node for t in turns] == [conversation.node] * (1 + LATER_TURNS)
            for n, (before, turn) in enumerate(itertools.pairwise(turns)):
                # a and b read the whole turn before from cache, though two conversations
                # take turns on their one slot (the RAM cache holds the other); c, with
                # neither, reads nothing: each conversation evicts the other.
                found = before.prompt_tokens
                if conversation.node == "c" and not (conversation is first_on_c and not n and kept):
                    found = 0
                assert turn.cached_tokens == found, (conversation.node, turns)
                assert turn.prompt_tokens > before.prompt_tokens
        # c's 20 routed answers found (almost) nothing: its conversations now go by the plain
        # order, to the node dispatched to least recently (the last round went in the
        # conversations' order). Were that c itself, a new conversation takes c's turn first.
        recency = [c.node for c in conversations]
        newcomers = []
        if least_recent(recency) == "c":
            newcomers.append(Conversation(CONVERSATIONS))
            assert (await newcomers[0].say(port)).node == "c"
            recency.append("c")
        (on_c, *_) = [c for c in conversations if c.node == "c"]
        assert (await on_c.say(port)).node == least_recent(recency) != "c"
        conversations = [*conversations, *newcomers]

        by_node = served(conversations)
        seen = await caches(admin, CONVERSATIONS * (1 + LATER_TURNS) + 1 + len(newcomers))
        for node, turns in by_node.items():
            prompt = sum(t.prompt_tokens for t in turns)
            cached = sum(t.cached_tokens for t in turns)
            assert {k: seen[node][k] for k in ("answers", "promptTokens", "cachedTokens")} == {
                "answers": len(turns),
                "promptTokens": prompt,
                "cachedTokens": cached,
            }, (node, seen)
            assert seen[node]["share"] == round(cached / prompt, 3)
        assert seen["a"]["share"] > 0.5 and seen["b"]["share"] > 0.5, seen
        assert seen["c"]["share"] < 0.05 and seen["c"]["suspendedUntil"] is not None, seen
        assert seen["a"]["suspendedUntil"] is None and seen["b"]["suspendedUntil"] is None

        _, samples = await scrape(admin)
        counted = samples["nvpair_tokens_total"][labels(engine="llamacpp", kind="cached")]
        assert counted == sum(c["cachedTokens"] for c in seen.values())
        assert counted == sum(t.cached_tokens for c in conversations for t in c.turns) > 0


@pytest_twisted.ensureDeferred
async def test_the_status_page_shows_each_nodes_cache_share_and_the_suspension(
    tmp_path: Path, browser: Browser
) -> None:
    """The page, loaded once the conversations are done, shows each node's cache line: the
    share of its prompt tokens read from cache, over how many answers — and for ``c``,
    "affinity suspended until" a time. A screenshot is kept."""
    async with three_nodes(tmp_path) as (_proxy, port, admin, sims):
        conversations = await start(port, sims)
        await go_on(port, conversations)
        answers = CONVERSATIONS * (1 + LATER_TURNS)
        seen = await caches(admin, answers)

        page, png = await deferToThread(page_and_screenshot, browser, admin)
        keep_screenshot(png, tmp_path / "issue23-status.png")
        cells = {cell["node"]: cell for cell in page["cells"]}
        assert sorted(cells) == list(NODES), page
        each = 2 * (1 + LATER_TURNS)
        for node in NODES:
            cache = seen[node]
            share = math.floor(cache["share"] * 100 + 0.5)  # JavaScript's Math.round
            line = f"cache {share}% of {cache['promptTokens']} prompt tokens ({each} answers)"
            assert cells[node]["cache"].startswith(line), (node, cells[node])
        assert cells["a"]["cache"].endswith("answers)"), cells["a"]
        assert cells["b"]["cache"].endswith("answers)"), cells["b"]
        suspended = cells["c"]["cache"].split(", ")[-1]
        assert suspended.startswith("affinity suspended until "), cells["c"]
        assert suspended.removeprefix("affinity suspended until ").count(":") == 2, suspended


@pytest_twisted.ensureDeferred
async def test_with_affinity_off_the_later_turns_go_by_the_plain_order(tmp_path: Path) -> None:
    """``[scheduling] affinity = false``: the same conversations start on every node, by load,
    but each later turn goes by the plain order — all idle, the node dispatched to least
    recently — and reads from cache only what that node happens to hold: the two conversations
    that started on ``a`` go on on every node in turn, never only on ``a``."""
    async with three_nodes(tmp_path, affinity=False) as (_proxy, port, admin, sims):
        conversations = await start(port, sims)
        on_a = [c for c in conversations if c.node == "a"]
        nodes = [(await c.say(port)).node for _ in range(3) for c in on_a]
        assert set(nodes[:3]) == set(NODES) and nodes[3:] == nodes[:3], nodes
        _, status = await admin_get(admin, "/status")
        assert status["affinity"] == {"enabled": False, "slack": 2, "entries": 0, "bound": 100_000}
