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
    """One engine's discovery nodes, and the aliases its nodes' own names shadow."""

    nodes: tuple[Node, ...]
    shadowed: tuple[str, ...]


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
            other_names=others,
        )
        for (node, models), keys, others in zip(serving, names.keys, names.others, strict=True)
    )
    return Nodes(nodes, names.shadowed)
