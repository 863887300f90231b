# -*- test-case-name: tests.control.test_affinity_forget -*-
"""A node that restarted forgets (issue 33 item 3;
docs/fleet-scheduling.md#a-node-that-restarted-forgets): when a node leaves discovery, or its
engine is seen starting again (a llama-server loading as a whole), its entries in the prefix
table go, so that the next turn of its conversations is not sent to a cache that is gone.
Through the fleet's polls on a Clock, with scripted engine answers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from twisted.internet.error import ConnectionRefusedError

from nvpair.control.affinity import PrefixTable, scope
from nvpair.engines.conversation import prefix_keys
from nvpair.fleet.scheduling import FleetScheduler
from tests.fleet.test_fleet_loadpoll import LoadPolling, serve_round, started
from tests.fleet.test_fleet_poll import INTERVAL

ENGINE = "llamacpp"
EVERYONE = lambda _: True  # noqa: E731
KEYS = prefix_keys({"messages": [{"role": "user", "content": "hello"}]})
NEXT = prefix_keys(
    {
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "more"},
        ]
    }
)


def test_forgetting_a_node_drops_its_entries_and_no_other() -> None:
    table = PrefixTable()
    within = scope(ENGINE, "m")
    table.record(within, (1, 2), ENGINE, "a")
    table.record(within, (3,), ENGINE, "b")
    # The same node id under another engine is another owner, with a cache of its own.
    table.record(scope("ollama", "m"), (1, 2), "ollama", "a")
    assert table.forget(ENGINE, "a") == 2
    assert table.owner(within, (1, 2), EVERYONE) is None
    assert table.owner(within, (3,), EVERYONE) == ("b", 1)
    assert table.owner(scope("ollama", "m"), (1, 2), EVERYONE) == ("a", 2)
    assert len(table) == 3
    assert table.forget(ENGINE, "a") == 0
    # Served again, it is found again.
    table.record(within, (1,), ENGINE, "a")
    assert table.owner(within, (1, 2), EVERYONE) == ("a", 1)


@pytest.fixture
def llama() -> Iterator[LoadPolling]:
    yield from started(ENGINE)


def served_on_a(llama: LoadPolling) -> FleetScheduler:
    """``a`` and ``b`` in discovery, ``a`` served the first turn of a conversation."""
    serve_round(llama, "a", ready=True)
    serve_round(llama, "b", ready=True)
    scheduler = llama.scheduler
    scheduler.answered(ENGINE, "a", "tiny", KEYS, None, affine=False)
    assert affine(llama) == "a"
    return scheduler


def affine(llama: LoadPolling) -> str | None:
    """Where the conversation's next turn goes first for affinity now."""
    nodes = llama.control.discovery(ENGINE).nodes
    return llama.scheduler.plan(ENGINE, nodes, None, "tiny", {}, NEXT).affine


def test_a_node_that_left_discovery_is_forgotten(llama: LoadPolling) -> None:
    served_on_a(llama)
    llama.clock.advance(INTERVAL)
    for path in ("/v1/models", "/health", "/props", "/slots"):
        for deferred in llama.pending("a", path):
            deferred.errback(ConnectionRefusedError())
    assert set(llama.nodes()) == {"b"}
    # Back, with an empty cache: the conversation is new to the fleet.
    llama.clock.advance(INTERVAL)
    serve_round(llama, "a", ready=True)
    assert set(llama.nodes()) == {"a", "b"}
    assert affine(llama) is None
    assert len(llama.scheduler.table) == 0


def test_a_node_seen_starting_again_is_forgotten_though_it_never_left(llama: LoadPolling) -> None:
    """A llama-server restarted between two polls answers the next one 503 loading: it stays
    in discovery, but what it held went with the old process."""
    served_on_a(llama)
    llama.clock.advance(INTERVAL)
    serve_round(llama, "a", ready=False)
    assert set(llama.nodes()) == {"a", "b"}
    assert len(llama.scheduler.table) == 0
    llama.clock.advance(INTERVAL)
    serve_round(llama, "a", ready=True)
    assert affine(llama) is None


def test_a_node_that_stays_keeps_its_conversations(llama: LoadPolling) -> None:
    """Polls that answer change nothing: ``a`` still has the conversation after several."""
    served_on_a(llama)
    for _ in range(3):
        llama.clock.advance(INTERVAL)
        serve_round(llama, "a", ready=True)
        serve_round(llama, "b", ready=True)
    assert affine(llama) == "a"


def test_another_node_leaving_forgets_nothing_of_this_one(llama: LoadPolling) -> None:
    served_on_a(llama)
    llama.clock.advance(INTERVAL)
    serve_round(llama, "a", ready=True)
    for path in ("/v1/models", "/health", "/props", "/slots"):
        for deferred in llama.pending("b", path):
            deferred.errback(ConnectionRefusedError())
    assert set(llama.nodes()) == {"a"}
    assert affine(llama) == "a"
