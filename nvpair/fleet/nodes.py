"""Standalone fleet mode's discovery nodes, from what each node's poll answered.

A node is in an engine's discovery with the models its engine listed and, besides, the other
names people use for them (:mod:`nvpair.engines.modelnames`; docs/model-names.md): its
``model_keys`` answer to all of them, so the request path finds the owners of a file name or an
alias as it finds those of a reported name.
"""

from __future__ import annotations

from collections.abc import Mapping

from attrs import frozen

from nvpair.control.state import Node
from nvpair.engines.modelnames import Aliases, known_names
from nvpair.engines.table import Engine


@frozen
class Nodes:
    """One engine's discovery nodes, the aliases its nodes' own names shadow, and every
    pattern alias in the order they are tried."""

    nodes: tuple[Node, ...]
    shadowed: tuple[str, ...]
    patterns: tuple[str, ...] = ()


def discovery_nodes(
    engine: Engine,
    answered: Mapping[str, tuple[str, ...]],
    urls: Mapping[str, str],
    aliases: Aliases,
) -> Nodes:
    """The nodes of ``engine`` in discovery now: those whose last poll answered (node id to
    models, in that order) and are still in the file (node id to URL)."""
    serving = [(node, models) for node, models in answered.items() if node in urls]
    names = known_names(engine, [models for _, models in serving], aliases)
    nodes = tuple(
        Node(
            id=node,
            local=False,
            url=urls[node],
            models=models,
            model_keys=keys,
            engine=engine.id,
            other_names=others,
            patterns=caught,
        )
        for (node, models), keys, others, caught in zip(
            serving, names.keys, names.others, names.patterns, strict=True
        )
    )
    return Nodes(nodes, names.shadowed, tuple(pattern for pattern, _ in aliases.patterns))
