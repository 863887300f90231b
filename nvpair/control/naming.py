"""Which pattern alias, if any, takes a request: the one place a name the fleet does not know
meets ``[models]``'s patterns (docs/model-names.md#pattern-aliases).

A pattern takes only a name no node answers to on any engine the facade serves — reported,
file name or plain alias — and no node now down last listed: a name whose owners are away
waits for them as it always has, rather than being served by another model behind the
client's back. Pure: discovery snapshots in, a pattern out.
"""

from __future__ import annotations

from collections.abc import Callable

from nvpair.control.state import Discovery
from nvpair.engines.patternnames import choose, ordered
from nvpair.engines.table import ENGINES, Dialect


def pattern_taking(
    facade: Dialect,
    name: str,
    discovery: Callable[[str], Discovery],
    down: Callable[[str, str], bool],
) -> str | None:
    """The pattern alias that takes a request to ``facade`` naming ``name``, or None.

    :param discovery: each served engine's live snapshot, by engine id.
    :param down: whether a node out of discovery last listed a model key on an engine.
    """
    found = [discovery(engine).patterns for engine in facade.serves]
    first = next((patterns for patterns in found if patterns), ())
    if not first:
        return None  # the common case: no pattern anywhere, nothing more to look up
    for engine in facade.serves:
        key = ENGINES[engine].model_key(name)
        if discovery(engine).owners(key) or down(engine, key):
            return None
    # One fleet file gives every engine the same patterns; while a reload republishes them
    # engine by engine, their union, in the order patterns are always tried.
    patterns = first if all(p in ((), first) for p in found) else ordered(sum(found, ()))
    return choose(patterns, name, facade.model_key("A") == facade.model_key("a"))
