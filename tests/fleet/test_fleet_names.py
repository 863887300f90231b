"""Fleet mode's discovery answers to the names people use, and ``[models]`` is re-read live
(nvpair/fleet/polls.py, nvpair/fleet/nodes.py; docs/model-names.md)."""

from __future__ import annotations

from attrs import evolve
from twisted.logger import capturedLogs

from nvpair.engines.modelnames import Aliases
from nvpair.engines.table import LMSTUDIO, OLLAMA
from nvpair.fleet.file import Fleet
from nvpair.fleet.health import HealthPolicy
from nvpair.fleet.nodes import discovery_nodes
from tests.fakes import harness
from tests.fleet.test_fleet_poll import Polling, fleet, polling, tags

__all__ = ["polling"]  # the fixture, shared

LLAMA3 = OLLAMA.model_key("llama3")


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


def test_a_request_by_file_name_joins_the_load_it_set_off_under_the_nodes_own_name() -> None:
    """docs/model-names.md#load-state-and-order: a dispatch by file name counts the node's own
    name as loading there, so a second request joins it rather than loading the model on the
    other cold owner; each attempt's body names the node's own id."""
    h = harness(fleet=HealthPolicy(threshold=3, cooldown=5.0, cooldown_max=120.0))
    answered = {"a": ("pub/q/m.gguf",), "b": ("other/m.gguf",)}
    found = discovery_nodes(LMSTUDIO, answered, {"a": "http://a", "b": "http://b"}, Aliases())
    h.nodes(*found.nodes)
    h.serve("m")
    h.serve("m.gguf")
    assert [call.base for call in h.upstream.calls] == ["http://a", "http://a"]
    assert [call.body for call in h.upstream.calls] == [b'{"model": "pub/q/m.gguf"}'] * 2
