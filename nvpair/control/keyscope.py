"""What a fleet key's model patterns let a request reach, judged on the fleet's names for the
model it resolves to (docs/lan.md#what-a-key-can-and-cannot-do).

A request names a model in the engine's spelling; the fleet routes it by the engine's
comparison key to the nodes that have it, and each node may know it by its own name behind a
file name or an alias. A key is held to the model a node would serve, never to the spelling:
a node is a candidate for a keyed request only when its model is one the key may use
(:meth:`KeyScope.node_allowed`), and a name no node has is judged by what the engine would
read it as (:meth:`KeyScope.name_allowed`). Pure: discovery snapshots in, booleans out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from nvpair.control.state import Discovery, Node
from nvpair.engines.caller import permits
from nvpair.engines.patternnames import PatternKey
from nvpair.engines.table import ENGINES, Dialect


class KeyScope:
    """One keyed request's view of the fleet: which models its key may use.

    :param patterns: the key's model patterns (not empty: an unrestricted key needs no scope).
    :param facade: the facade the request came to; its own dialect judges a name no engine
        it serves has.
    :param discovery: each served engine's live snapshot, by engine id.
    """

    def __init__(
        self,
        patterns: Sequence[str],
        facade: Dialect,
        discovery: Callable[[str], Discovery],
    ) -> None:
        self._patterns = patterns
        self._facade = facade
        self._discovery = discovery

    def node_allowed(self, node: Node, model_key: str) -> bool:
        """Whether ``node``'s model for a request naming ``model_key`` (the node's own name
        behind an alias or a file name, else the model itself) is one the key may use, under
        any name the node's engine's nodes know that model by."""
        engine = ENGINES[node.engine]
        own = node.own_key(model_key)
        assert own is not None
        return permits(self._patterns, engine, self._discovery(node.engine).names_of(own))

    def name_allowed(self, engine: Dialect, name: str) -> bool:
        """Whether the key may use the model ``engine`` would read ``name`` as, where no node
        is asked for it by this name (a name the fleet has no owner of, a copy's source or
        destination, a model in a query): judged under every name the engine's nodes know it
        by, and by its own readings when they know it by none."""
        key = engine.model_key(name)
        if engine.id in ENGINES:
            return permits(self._patterns, engine, self._discovery(engine.id).names_of(key))
        return permits(self._patterns, engine, (name,))

    def allows(self, name: str, pattern: str | None = None) -> bool:
        """Whether a request routed on ``name`` may go anywhere: some owner of it, on any
        engine the facade serves, holds a model the key may use; with no owner anywhere, the
        name itself is judged (:meth:`name_allowed`). Also what a model list shows it.

        :param pattern: the pattern alias that took the request: its owners are judged, each
            on the model it serves for it, and never on the pattern, which is no name
            (docs/model-names.md#pattern-aliases)."""
        owned = False
        for engine_id in self._facade.serves:
            key = ENGINES[engine_id].model_key(name) if pattern is None else PatternKey(pattern)
            for node in self._discovery(engine_id).owners(key):
                owned = True
                if self.node_allowed(node, key):
                    return True
        return not owned and self.name_allowed(self._facade, name)
