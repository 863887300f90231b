"""Broker method params: every refusal names its field (-32602)."""

from __future__ import annotations

from typing import Any

import pytest

from nvpair.broker import RpcError
from nvpair.engines import LMSTUDIO, OLLAMA
from nvpair.rpc import parse_nodes, parse_priority


def refused_field(call: Any) -> str:
    with pytest.raises(RpcError) as refused:
        call()
    assert refused.value.code == -32602
    assert refused.value.data is not None
    return str(refused.value.data["field"])


def test_nodes_are_parsed_with_normalized_keys() -> None:
    nodes = parse_nodes(
        OLLAMA,
        {
            "nodes": [
                {"id": "a", "local": True, "models": ["Llama3"]},
                {"id": "b", "url": "https://10.0.0.2:11434", "models": []},
            ]
        },
    )
    assert nodes[0].local and nodes[0].models == ("Llama3",)
    assert nodes[0].model_keys == {OLLAMA.model_key("llama3:latest")}
    assert nodes[1].url == "https://10.0.0.2:11434" and nodes[1].model_keys == frozenset()


def test_lmstudio_keys_are_exact() -> None:
    nodes = parse_nodes(LMSTUDIO, {"nodes": [{"id": "a", "url": "http://h:1", "models": ["Q"]}]})
    assert nodes[0].model_keys == {"Q"}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "nodes"),
        ({"nodes": {}}, "nodes"),
        ({"nodes": [1]}, "nodes[0]"),
        ({"nodes": [{"url": "http://h:1"}]}, "nodes[0].id"),
        (
            {"nodes": [{"id": "a", "url": "http://h:1"}, {"id": "a", "url": "http://h:2"}]},
            "nodes[1].id",
        ),
        ({"nodes": [{"id": "a"}]}, "nodes[0].url"),
        ({"nodes": [{"id": "a", "url": "ftp://h"}]}, "nodes[0].url"),
        ({"nodes": [{"id": "a", "local": "yes"}]}, "nodes[0].local"),
        ({"nodes": [{"id": "a", "local": True, "models": "m"}]}, "nodes[0].models"),
        ({"nodes": [{"id": "a", "local": True, "models": [1]}]}, "nodes[0].models"),
    ],
)
def test_bad_nodes_name_the_field(params: dict[str, Any], field: str) -> None:
    assert refused_field(lambda: parse_nodes(OLLAMA, params)) == field


def test_priority_snapshot() -> None:
    generation, entries = parse_priority(
        {"generation": 4, "nodes": [{"id": "a", "pending": 2, "gpuPressure": 0.5}]}
    )
    assert generation == 4 and entries[0].pending == 2 and entries[0].gpu_pressure == 0.5


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"nodes": []}, "generation"),
        ({"generation": True, "nodes": []}, "generation"),
        ({"generation": 1}, "nodes"),
        ({"generation": 1, "nodes": [{"id": "a", "pending": -1}]}, "nodes[0].pending"),
        ({"generation": 1, "nodes": [{"id": "a", "gpuPressure": "x"}]}, "nodes[0].gpuPressure"),
    ],
)
def test_bad_priority_names_the_field(params: dict[str, Any], field: str) -> None:
    assert refused_field(lambda: parse_priority(params)) == field
