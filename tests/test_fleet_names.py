"""Fleet mode's discovery answers to the names people use, and ``[models]`` is re-read live
(nvpair/fleet.py, nvpair/fleetnodes.py; docs/model-names.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from attrs import evolve
from twisted.logger import capturedLogs

from nvpair.engines import OLLAMA
from nvpair.fleetfile import Fleet
from nvpair.modelnames import Aliases
from tests.test_fleet_poll import Polling, fleet, tags

LLAMA3 = OLLAMA.model_key("llama3")


@pytest.fixture
def polling() -> Iterator[Polling]:
    harness = Polling()
    harness.service.startService()
    yield harness
    if harness.service.running:
        harness.service.stopService()


def owners(polling: Polling, name: str) -> dict[str, str | None]:
    key = OLLAMA.model_key(name)
    return {n.id: n.own_name(key) for n in polling.control.discovery("ollama").owners(key)}


def with_models(table: dict[str, list[str]]) -> Fleet:
    return evolve(fleet(("a", "http://a"), ("b", "http://b")), models=Aliases.parse(table))


def test_an_alias_added_at_sighup_routes_at_once_and_one_removed_stops(polling: Polling) -> None:
    polling.agent.answer("a", tags("llama3.1:8b"))
    polling.agent.answer("b", tags("qwen2:7b"))
    assert owners(polling, "llama3") == {}
    polling.service.reload(with_models({"llama3": ["llama3.1:8b", "qwen2:7b"]}))
    assert owners(polling, "llama3") == {"a": "llama3.1:8b", "b": "qwen2:7b"}
    # No poll was needed, and none was made: the snapshot was rebuilt from what is known.
    assert [len(polling.agent.polls(n)) for n in "ab"] == [1, 1]
    polling.service.reload(fleet(("a", "http://a"), ("b", "http://b")))
    assert owners(polling, "llama3") == {}


def test_a_reload_before_any_answer_publishes_nothing(polling: Polling) -> None:
    """An engine with no snapshot yet keeps none: its first poll makes it."""
    polling.service.reload(with_models({"llama3": ["llama3.1:8b"]}))
    assert not polling.control.reported("ollama")
    polling.agent.answer("a", tags("llama3.1:8b"))
    assert owners(polling, "llama3") == {"a": "llama3.1:8b"}


def test_a_node_reporting_an_aliases_name_wins_it_with_one_warning(polling: Polling) -> None:
    """docs/model-names.md#conflicts: at run time the reported name wins, said once."""
    polling.service.reload(with_models({"llama3": ["llama3.1:8b"]}))
    polling.agent.answer("a", tags("llama3.1:8b"))
    with capturedLogs() as logs:
        polling.agent.answer("b", tags("Llama3:latest"))
        assert owners(polling, "llama3") == {"b": None}
        polling.clock.advance(5)
        polling.agent.answer("a", tags("llama3.1:8b", "phi3"))
    warnings = [e for e in logs if e.get("alias") == "llama3"]
    assert len(warnings) == 1
    assert warnings[0]["engine"] == "ollama"
    assert owners(polling, "llama3") == {"b": None}
