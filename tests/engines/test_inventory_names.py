"""Model lists with the names people use listed once each (nvpair/engines/inventory.py,
docs/model-names.md#inventories)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from nvpair.control.state import Discovery
from nvpair.engines.inventory import merge_inventories
from nvpair.engines.modelnames import Aliases, OtherName, known_names
from nvpair.engines.table import LLAMACPP, LMSTUDIO, OLLAMA, Engine
from nvpair.fleet.nodes import discovery_nodes

Entry = dict[str, object]


def names(
    engine: Engine, inventories: Sequence[Sequence[str]], table: object = None
) -> list[OtherName]:
    """Every node's other names, in node order, as the fan-out hands them to the merge."""
    aliases = Aliases.parse(table) if table is not None else Aliases()
    return [o for node in known_names(engine, inventories, aliases).others for o in node]


def merged(
    engine: Engine, path: str, nodes: Sequence[Sequence[Entry]], others: Sequence[OtherName]
) -> list[Entry]:
    route = engine.inventory[path]
    bodies = [json.dumps({**route.empty, route.list_field: entries}).encode() for entries in nodes]
    document = json.loads(merge_inventories(engine, path, bodies, others))
    listed = document[route.list_field]
    assert isinstance(listed, list)
    return listed


def llama_entry(model_id: str, created: int) -> Entry:
    return {
        "id": model_id,
        "object": "model",
        "owned_by": "llamacpp",
        "created": created,
        "aliases": [model_id],
    }


def test_each_file_name_is_listed_once_after_its_first_owners_entry() -> None:
    ids = [["/a/qwen.gguf"], ["/b/qwen.gguf", "other"], ["qwen.gguf"]]
    nodes = [
        [llama_entry(model, 1 + i + j) for j, model in enumerate(n)] for i, n in enumerate(ids)
    ]
    others = names(LLAMACPP, ids)
    listed = merged(LLAMACPP, "/v1/models", nodes, others)
    assert [e["id"] for e in listed] == [
        "/a/qwen.gguf",
        # qwen.gguf is node c's own name: its own entry, not a copy.
        "qwen",
        "/b/qwen.gguf",
        "other",
        "qwen.gguf",
    ]
    # The copy is the first owner's entry, the name changed and nothing else.
    assert listed[1] == {**llama_entry("/a/qwen.gguf", 1), "id": "qwen"}


def test_an_ollama_alias_is_shown_as_ollama_shows_names_in_both_name_fields() -> None:
    owner = {
        "name": "llama3.1:8b",
        "model": "llama3.1:8b",
        "modified_at": "2026-01-02T00:00:00Z",
        "digest": "abc",
        "size": 7,
    }
    newer = {
        **owner,
        "name": "qwen2:7b",
        "model": "qwen2:7b",
        "modified_at": "2026-03-01T00:00:00Z",
    }
    older = {
        **owner,
        "name": "phi3:latest",
        "model": "phi3:latest",
        "modified_at": "2025-01-01T00:00:00Z",
    }
    others = names(
        OLLAMA, [["llama3.1:8b", "qwen2:7b", "phi3:latest"]], {"llama3": ["llama3.1:8b"]}
    )
    listed = merged(OLLAMA, "/api/tags", [[older, owner, newer]], others)
    # Newest first, as Ollama sorts; the copy keeps its owner's date, right after it.
    assert [e["name"] for e in listed] == [
        "qwen2:7b",
        "llama3.1:8b",
        "llama3:latest",
        "phi3:latest",
    ]
    assert listed[2] == {**owner, "name": "llama3:latest", "model": "llama3:latest"}


def test_an_alias_is_copied_from_the_first_entry_of_any_of_its_models() -> None:
    """Node a has one of the alias's models, node b the other: the merged list's first wins."""
    table = {"chat": ["big", "/m/small.gguf"]}
    a, b = [llama_entry("/m/small.gguf", 1)], [llama_entry("big", 2)]
    others = names(LMSTUDIO, [["/m/small.gguf"], ["big"]], table)
    listed = merged(LMSTUDIO, "/v1/models", [a, b], others)
    assert [e["id"] for e in listed] == ["/m/small.gguf", "small.gguf", "small", "chat", "big"]
    assert listed[3]["created"] == 1
    listed = merged(LMSTUDIO, "/v1/models", [b, a], others)
    assert [e["id"] for e in listed] == ["big", "chat", "/m/small.gguf", "small.gguf", "small"]


def test_a_name_none_of_whose_models_is_listed_is_left_out() -> None:
    """/api/ps lists the models in memory: an alias of one that is not is not there."""
    others = names(OLLAMA, [["llama3.1:8b", "phi3:latest"]], {"llama3": ["llama3.1:8b"]})
    ps: list[Entry] = [{"name": "phi3:latest", "model": "phi3:latest"}]
    assert merged(OLLAMA, "/api/ps", [ps], others) == ps


def test_lm_studio_native_list_renames_its_key_field() -> None:
    entry: Entry = {"key": "pub/q4.gguf", "display_name": "Q4", "type": "llm"}
    others = names(LMSTUDIO, [["pub/q4.gguf"]])
    listed = merged(LMSTUDIO, "/api/v1/models", [[entry]], others)
    assert [e["key"] for e in listed] == ["pub/q4.gguf", "q4.gguf", "q4"]
    assert listed[2] == {"key": "q4", "display_name": "Q4", "type": "llm"}


def test_without_other_names_the_merge_is_unchanged() -> None:
    nodes = [[llama_entry("/a/qwen.gguf", 1)]]
    route = LLAMACPP.inventory["/v1/models"]
    body = [json.dumps({**route.empty, "data": nodes[0]}).encode()]
    assert merge_inventories(LLAMACPP, "/v1/models", body) == merge_inventories(
        LLAMACPP, "/v1/models", body, []
    )


_ids = st.sampled_from(["/a/q.gguf", "/b/q.gguf", "q.gguf", "q", "/c/r.gguf", "x"])


@given(st.lists(st.lists(_ids, max_size=4, unique=True), min_size=1, max_size=4))
def test_every_name_a_request_finds_is_listed_exactly_once(inventories: list[list[str]]) -> None:
    """What the list shows is what routes: each name with an owner appears once, every node's
    own entries stay, in node order."""
    aliases = Aliases.parse({"chat": ["q", "x"]})
    found = known_names(LLAMACPP, inventories, aliases)
    others = [o for node in found.others for o in node]
    nodes = [[llama_entry(model, i) for model in models] for i, models in enumerate(inventories)]
    listed = [e["id"] for e in merged(LLAMACPP, "/v1/models", nodes, others)]
    assert len(listed) == len(set(listed))
    answered = set().union(*found.keys)
    assert set(listed) == answered
    own = [model for models in inventories for model in models]
    assert [m for m in listed if m in own] == list(dict.fromkeys(own))
    snapshot = Discovery(
        discovery_nodes(
            LLAMACPP,
            {f"n{i}": tuple(m) for i, m in enumerate(inventories)},
            {f"n{i}": "http://n:1" for i in range(len(inventories))},
            aliases,
        ).nodes
    )
    for name in listed:
        assert isinstance(name, str) and snapshot.owners(name)
