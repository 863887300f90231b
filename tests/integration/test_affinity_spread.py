"""Conversations on idle nodes, as the operator sees them (issue 33 items 1, 2 and 3;
docs/fleet-scheduling.md#ties-spread, #what-the-operator-sees-of-affinity,
#a-node-that-restarted-forgets).

Through ``twistd -n nvpair-proxy --fleet`` and the openai SDK, in front of three simulated
``llama-server``s (``tests/integration/test_conversation_cache.py``'s fleet), every node idle:
conversations started one after another start on different nodes — the one dispatched to least
recently each time — rather than all on the lowest id, and each goes on where it started.
``/status``, ``/metrics``, the access log and the status page say what the order did with each
request's conversation; a node that went down and came back has forgotten its conversations.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, succeed
from twisted.internet.threads import deferToThread

from tests.integration.browser import Browser
from tests.integration.test_conversation_cache import NODES, Conversation, three_nodes
from tests.integration.test_fleet import eventually
from tests.integration.test_fleet_operator import admin_get
from tests.integration.test_metrics_endpoint import labels, scrape
from tests.integration.test_status_page import browser, keep_screenshot, page_and_screenshot

pytestmark = pytest.mark.integration

__all__ = ["browser"]  # the module's headless Chromium, a fixture of test_status_page


@pytest_twisted.ensureDeferred
async def test_new_conversations_on_idle_nodes_start_on_different_nodes(tmp_path: Path) -> None:
    async with three_nodes(tmp_path) as (_proxy, port, _admin, _sims):
        conversations = [Conversation(n) for n in range(2 * len(NODES))]
        # One at a time: every node is idle when each first turn is placed.
        firsts = [(await c.say(port)).node for c in conversations]
        assert firsts == [*NODES, *NODES], firsts
        # Each goes on on the node that holds its cache, and finds it there — but on ``c``,
        # which keeps no prompt in RAM: its two conversations evict each other from its slot.
        for conversation in conversations:
            turn = await conversation.say(port)
            assert turn.node == conversation.node
            assert (turn.cached_tokens > 0) == (turn.node != "c"), conversation.turns


# -- what the operator sees (issue 33 item 2; docs/fleet-scheduling.md
# #what-the-operator-sees-of-affinity) ----------------------------------------------------------


def affinity_of(entry: dict[str, Any]) -> tuple[object, ...]:
    """A ``recent`` entry's affinity: result, why, the conversation's node."""
    return entry.get("affinity"), entry.get("affinityWhy"), entry.get("affinityNode")


@pytest_twisted.ensureDeferred
async def test_the_operator_sees_what_the_order_did_with_each_conversation(
    tmp_path: Path, browser: Browser
) -> None:
    """``/status`` ``recent``, ``/metrics``, the access log and the status page say, per
    request, whether the order followed its conversation's node, moved it and why, or knew
    none. ``a``'s one slot is taken by a held answer when ``c0``'s third turn comes: a node
    with a free slot goes first, and the turn moves (``tier``)."""
    async with three_nodes(tmp_path, True, "--access-log") as (proxy, port, admin, sims):
        c0, c1, c2, c3 = (Conversation(n) for n in range(4))
        assert (await c0.say(port)).node == "a"  # new
        assert (await c0.say(port)).node == "a"  # followed
        assert (await c1.say(port)).node == "b"  # new
        assert (await c2.say(port)).node == "c"  # new
        # a, dispatched to least recently, takes c3's first turn and holds it.
        sims[0].faults.header_delay = 3.0
        held = Deferred.fromCoroutine(c3.say(port))
        await eventually(lambda: succeed(sims[0].in_flight == 1), "c3 on a")
        moved = await c0.say(port)
        assert moved.node == "b"  # the free warm node dispatched to least recently
        assert (await held).node == "a"

        _, status = await admin_get(admin, "/status")
        recent = status["recent"]
        assert [affinity_of(entry) for entry in reversed(recent)] == [
            ("new", None, None),
            ("followed", None, "a"),
            ("new", None, None),
            ("new", None, None),
            ("new", None, None),
            ("moved", "tier", "a"),
        ], recent
        # The openai SDK's one request per turn, each judged at its first dispatch.
        _, samples = await scrape(admin)
        counted = samples["nvpair_affinity_total"]
        assert counted == {
            labels(engine="llamacpp", node="a", result="new"): 2,
            labels(engine="llamacpp", node="a", result="followed"): 1,
            labels(engine="llamacpp", node="b", result="new"): 1,
            labels(engine="llamacpp", node="c", result="new"): 1,
            labels(engine="llamacpp", node="b", result="moved"): 1,
        }, counted
        # Cached prompt tokens, per node that answered, as the answers said.
        cached = samples["nvpair_cached_tokens_total"]
        turns = [t for c in (c0, c1, c2, c3) for t in c.turns]
        for node in NODES:
            read = sum(t.cached_tokens for t in turns if t.node == node)
            assert cached.get(labels(engine="llamacpp", node=node), 0) == read, (node, cached)
        assert cached[labels(engine="llamacpp", node="a")] > 0  # c0's second turn

        # The access log says it too.
        lines = [r for r in proxy.logs if r.get("route") == "inference" and "duration_ms" in r]
        said = Counter((r.get("affinity"), r.get("affinity_why")) for r in lines)
        assert said == {("new", None): 4, ("followed", None): 1, ("moved", "tier"): 1}, lines

        # And the page, one row per request, newest first.
        page, png = await deferToThread(page_and_screenshot, browser, admin)
        keep_screenshot(png, tmp_path / "issue33-affinity.png")
        shown = [row["cells"][-1] for row in page["rows"]]
        assert shown == ["moved from a: tier", "new", "new", "new", "followed", "new"], page


# -- a node that restarted forgets (issue 33 item 3;
# docs/fleet-scheduling.md#a-node-that-restarted-forgets) ----------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_node_that_went_down_and_came_back_is_not_followed(tmp_path: Path) -> None:
    """``c0`` lives on ``a``; ``a`` stops answering (its poll is refused: it leaves
    discovery), then listens again. Its cache went with it, so ``c0``'s next turn goes by the
    plain order — to ``b``, dispatched to least recently — as ``new``."""
    async with three_nodes(tmp_path) as (_proxy, port, admin, sims):
        c0, c1, c2 = (Conversation(n) for n in range(3))
        assert (await c0.say(port)).node == "a"
        assert (await c1.say(port)).node == "b"
        assert (await c2.say(port)).node == "c"
        assert (await c0.say(port)).node == "a"  # followed: b is least recent now
        await sims[0].refuse()
        await eventually(lambda: node_state(admin, "a", "down"), "a down")
        sims[0].resume()
        await eventually(lambda: node_state(admin, "a", "up"), "a up again")
        turn = await c0.say(port)
        assert turn.node == "b", c0.turns
        _, status = await admin_get(admin, "/status")
        assert affinity_of(status["recent"][0]) == ("new", None, None)


async def node_state(admin: int, node: str, state: str) -> bool:
    _, status = await admin_get(admin, "/status")
    return any(n["id"] == node and n["state"] == state for n in status["nodes"]["llamacpp"])
