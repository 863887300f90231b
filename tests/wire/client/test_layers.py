"""The upstream client's modules import one way: each may use only those below it, so the
pure framing rules never reach for a connection and the connection never for the pool that
keeps it (docs/README.md#package-map)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import nvpair

#: Lowest first: a module may import the ones before it, never one after it.
LAYERS = [
    "nvpair.wire.client.types",
    "nvpair.wire.client.framing",
    "nvpair.wire.client.body",
    "nvpair.wire.client.reading",
    "nvpair.wire.client.connection",
    "nvpair.wire.client.pool",
    "nvpair.wire.client.upstream",
]


def imported(module: str) -> set[str]:
    path = Path(nvpair.__file__).parent.joinpath(*module.split(".")[1:]).with_suffix(".py")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found & set(LAYERS)


@pytest.mark.parametrize("module", LAYERS)
def test_an_upstream_module_imports_only_the_ones_below_it(module: str) -> None:
    below = set(LAYERS[: LAYERS.index(module)])
    assert imported(module) <= below


def test_each_layer_is_read_from_its_file() -> None:
    """The check reads the modules' imports, not nothing."""
    assert "nvpair.wire.client.types" in imported("nvpair.wire.client.connection")
