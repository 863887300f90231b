"""Who a request came from, where fleet mode's ``[access]`` is in force, and what its key lets
it use (docs/lan.md#keys).

Pure values and decisions: the facade records a :class:`Caller` on the request it admits; the
request path refuses a model outside the key's patterns (:func:`forbids`) and filters model
lists (:func:`may_use`); the status, the logs and the metrics name the key.
"""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase

from attrs import frozen

from nvpair.engines.table import Dialect, RouteClass


@frozen
class Caller:
    """A request's caller where ``[access]`` is in force (None stands for "not in force").

    :ivar name: the name of the fleet key it presented, if a valid one; None for a loopback
        caller that presented none and for a LAN caller where no key file is named.
    :ivar models: that key's shell-style patterns of the model names it may use; empty: every
        model.
    """

    name: str | None = None
    models: tuple[str, ...] = ()


#: A caller with no key.
KEYLESS = Caller()


def may_use(models: Sequence[str], engine: Dialect, model: str) -> bool:
    """Whether a key with the patterns ``models`` may use ``model`` on ``engine``: it has no
    patterns, or one matches the name as written or as the engine shows it (``llama3`` is
    ``llama3:latest`` to Ollama, whose names ignore case, so its patterns do too)."""
    if not models:
        return True
    names = {model, engine.model_display(model)}
    if engine.model_key("A") == engine.model_key("a"):
        # The engine's names ignore case (Ollama's do).
        names = {name.lower() for name in names}
        models = [pattern.lower() for pattern in models]
    return any(fnmatchcase(name, pattern) for name in names for pattern in models)


def forbids(caller: Caller | None, engine: Dialect, route: RouteClass, model: str | None) -> bool:
    """Whether a request is refused 403 ``forbidden-model`` for its key's patterns.

    An inference request that names no model is refused too: which model it gets is the
    engine's choice, not one the key can be held to. Another route is refused only for a
    model it names; a model list is filtered instead (:func:`may_use`, per entry).
    """
    if caller is None or not caller.models:
        return False
    if model is None:
        return route is RouteClass.INFERENCE
    if route is RouteClass.INVENTORY or route is RouteClass.PREFLIGHT:
        return False
    return not may_use(caller.models, engine, model)
