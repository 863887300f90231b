"""Control state: what the broker (or the fleet file) has told this process about the fleet.

Per-engine discovery snapshots, the scheduler's priority snapshot with its generation, manual
pins and each engine's local backend. The request path reads it per request as immutable
values, so a snapshot that arrives mid-request never changes what that request is looking at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from urllib.parse import urlsplit

from attrs import evolve, field, frozen
from twisted.logger import Logger

from nvpair.engines.modelnames import OtherName


@frozen
class Node:
    """One node of one engine's discovery snapshot.

    :ivar models: the inventory exactly as the engine names it.
    :ivar model_keys: the comparison keys (engine's normalization) of every name the node
        answers to: its inventory's and, in fleet mode, its other names'.
    :ivar engine: the engine whose snapshot holds it (:meth:`ControlState.set_discovery` says
        so): what a facade that reaches several engines' nodes dials it as.
    :ivar other_names: fleet mode: the names it is known by besides its inventory's (file
        names, ``[models]`` aliases), each with its own name for the model
        (docs/model-names.md).
    :ivar patterns: fleet mode: the pattern aliases it serves, keyed by their ``PatternKey``
        (in ``model_keys`` too); no names, so kept apart from ``other_names``
        (docs/model-names.md#pattern-aliases).
    """

    id: str
    local: bool
    url: str | None
    models: tuple[str, ...]
    model_keys: frozenset[str]
    engine: str = ""
    other_names: tuple[OtherName, ...] = ()
    patterns: tuple[OtherName, ...] = ()
    _by_key: Mapping[str, OtherName] = field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        by_key: dict[str, OtherName] = {}
        for other in (*self.other_names, *self.patterns):
            by_key.setdefault(other.key, other)
        object.__setattr__(self, "_by_key", by_key)

    def own_name(self, model_key: str | None) -> str | None:
        """The name this node reports for the model a request names by ``model_key``, when the
        request names it otherwise (a file name, an alias): what the body's ``model`` becomes
        (docs/model-names.md#the-node-gets-its-own-name). None: the request names it as the
        node does, or names no model, and goes as it was written."""
        other = self._by_key.get(model_key) if model_key is not None else None
        return None if other is None else other.reported

    def own_key(self, model_key: str | None) -> str | None:
        """The comparison key of the node's own name for ``model_key``: what its load state
        (models in memory) is keyed by."""
        other = self._by_key.get(model_key) if model_key is not None else None
        return model_key if other is None else other.reported_key


@frozen
class Discovery:
    """One engine's discovery snapshot; each one replaces the previous wholesale.

    Indexed by node id and by model key when it is made: snapshots are rare and requests many,
    so a request's routing costs the same with 2 nodes as with 256 (bench/README.md).

    :ivar patterns: fleet mode: every pattern alias of ``[models]``, in the order they are
        tried, whether a node serves it or not (docs/model-names.md#pattern-aliases).
    """

    nodes: tuple[Node, ...] = ()
    patterns: tuple[str, ...] = ()
    _by_id: Mapping[str, Node] = field(init=False, eq=False, repr=False)
    _by_model: Mapping[str, tuple[Node, ...]] = field(init=False, eq=False, repr=False)
    _with_models: tuple[Node, ...] = field(init=False, eq=False, repr=False)
    _also_known: Mapping[str, tuple[str, ...]] = field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        by_model: dict[str, list[Node]] = {}
        also: dict[str, list[str]] = {}
        for node in self.nodes:
            for key in node.model_keys:
                by_model.setdefault(key, []).append(node)
            for other in node.other_names:
                names = also.setdefault(other.reported_key, [])
                if other.name not in names:
                    names.append(other.name)
        # A frozen value is still being made here: its indexes are set once.
        object.__setattr__(self, "_by_id", {node.id: node for node in reversed(self.nodes)})
        object.__setattr__(self, "_by_model", {k: tuple(v) for k, v in by_model.items()})
        object.__setattr__(self, "_with_models", tuple(n for n in self.nodes if n.model_keys))
        object.__setattr__(self, "_also_known", {k: tuple(v) for k, v in also.items()})

    def node(self, node_id: str) -> Node | None:
        return self._by_id.get(node_id)

    def owners(self, model_key: str | None) -> tuple[Node, ...]:
        """Nodes advertising ``model_key``, in snapshot order; None: every node with a model."""
        if model_key is None:
            return self._with_models
        return self._by_model.get(model_key, ())

    def names_of(self, model_key: str) -> tuple[str, ...]:
        """The names a model the nodes report as ``model_key`` is known by here: the key itself
        and every other name (a file name, an alias) any node gives it (docs/model-names.md)."""
        return (model_key, *self._also_known.get(model_key, ()))


@frozen
class PriorityEntry:
    """A scheduler-listed node with the scheduler's own load figures."""

    id: str
    pending: float
    gpu_pressure: float


@frozen
class Priority:
    """The scheduler snapshot: the priority list, best first, and its generation.

    ``generation`` 0 with ``listed`` None is the state before any snapshot has arrived, in which
    every node counts as listed with no load (docs/candidate-order.md#order).
    """

    generation: int = 0
    entries: tuple[PriorityEntry, ...] | None = None

    def entry(self, node_id: str) -> PriorityEntry | None:
        if self.entries is None:
            return None
        for entry in self.entries:
            if entry.id == node_id:
                return entry
        return None


DiscoveryListener = Callable[[str, Discovery], None]


@frozen
class _Listeners:
    discovery: list[DiscoveryListener] = field(factory=list)
    priority: list[Callable[[Priority], None]] = field(factory=list)


#: The snapshot of an engine nobody has reported on yet.
_NO_NODES = Discovery()


class ControlState:
    """The process-wide control state every facade reads."""

    log = Logger()

    def __init__(self) -> None:
        self._discovery: dict[str, Discovery] = {}
        self._priority = Priority()
        self._pins: dict[str, str] = {}
        self._local_backends: dict[str, str] = {}
        self._listeners = _Listeners()

    # -- discovery -------------------------------------------------------------------------

    def discovery(self, engine: str) -> Discovery:
        snapshot = self._discovery.get(engine)
        # Not ``.get(engine, Discovery())``: that builds an empty snapshot on every call, and
        # this is called several times per request.
        return snapshot if snapshot is not None else _NO_NODES

    def reported(self, engine: str) -> bool:
        """Whether any discovery snapshot of ``engine`` has arrived (``/readyz``)."""
        return engine in self._discovery

    def set_discovery(
        self, engine: str, nodes: Iterable[Node], patterns: tuple[str, ...] = ()
    ) -> None:
        snapshot = Discovery(
            tuple(node if node.engine == engine else evolve(node, engine=engine) for node in nodes),
            patterns,
        )
        self._discovery[engine] = snapshot
        self.log.debug(
            "discovery for {engine}: {count} nodes", engine=engine, count=len(snapshot.nodes)
        )
        for listener in list(self._listeners.discovery):
            listener(engine, snapshot)

    def node_for_address(self, host: str, port: int) -> str | None:
        """The node whose ``https://`` URL is ``host:port`` in any engine's snapshot."""
        for snapshot in self._discovery.values():
            for node in snapshot.nodes:
                if node.url is None or not node.url.startswith("https://"):
                    continue
                parts = urlsplit(node.url)
                if parts.hostname == host and (parts.port or 443) == port:
                    return node.id
        return None

    def on_discovery(self, listener: DiscoveryListener) -> Callable[[], None]:
        """Call ``listener(engine, snapshot)`` on every new snapshot; returns an unsubscribe."""
        self._listeners.discovery.append(listener)
        return lambda: self._listeners.discovery.remove(listener)

    # -- scheduler priority ----------------------------------------------------------------

    @property
    def priority(self) -> Priority:
        return self._priority

    def set_priority(self, generation: int, entries: Iterable[PriorityEntry]) -> bool:
        """Apply a scheduler snapshot at most once; a generation not above the last is dropped.

        A redelivered snapshot must not clear live reservations
        (docs/candidate-order.md#reservations), so the caller learns whether this one was applied.
        """
        # The state before any snapshot also says generation 0 (entries None): a scheduler
        # whose first snapshot is generation 0 must still be heard.
        first = self._priority.entries is None
        if generation <= self._priority.generation and not first:
            self.log.debug(
                "ignored priority generation {generation} (have {current})",
                generation=generation,
                current=self._priority.generation,
            )
            return False
        self._priority = Priority(generation, tuple(entries))
        for listener in list(self._listeners.priority):
            listener(self._priority)
        return True

    def on_priority(self, listener: Callable[[Priority], None]) -> None:
        self._listeners.priority.append(listener)

    # -- pins and backends -----------------------------------------------------------------

    def pin(self, engine: str) -> str | None:
        return self._pins.get(engine)

    def set_pin(self, engine: str, node_id: str | None) -> None:
        if node_id is None:
            self._pins.pop(engine, None)
        else:
            self._pins[engine] = node_id

    def local_backend(self, engine: str) -> str | None:
        return self._local_backends.get(engine)

    def set_local_backend(self, engine: str, url: str | None) -> None:
        if url is None:
            self._local_backends.pop(engine, None)
        else:
            self._local_backends[engine] = url
