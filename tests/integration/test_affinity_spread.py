"""New conversations spread over idle nodes (issue 33 item 1;
docs/fleet-scheduling.md#ties-spread).

Through ``twistd -n nvpair-proxy --fleet`` and the openai SDK, in front of three simulated
``llama-server``s (``tests/integration/test_conversation_cache.py``'s fleet), every node idle:
conversations started one after another start on different nodes — the one dispatched to least
recently each time — rather than all on the lowest id, and each goes on where it started.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_twisted

from tests.integration.test_conversation_cache import NODES, Conversation, three_nodes

pytestmark = pytest.mark.integration


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
