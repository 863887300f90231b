"""The fleet queue's decisions: who is served next, where, and whether a node can start one more
(docs/fleet-scheduling.md#the-queue).

Pure: waiters, their options and the proxy's own requests in flight in, grants out. The live
queue (:mod:`nvpair.dispatch.queueing`) calls :func:`pump` whenever capacity may have freed (an
attempt ended, a poll read a node, a node joined) and hands each grant to its waiter.

- **Capacity** (:func:`capacity`): what a node's engine serves at once for a model — the slots
  llama.cpp reports (a router's, per model), else the node's ``parallel``, else the engine's
  own default. A request is **startable** there while this proxy's requests on it plus the
  slots its engine reports busy with others' work are below that; for a model the node does not
  hold in memory, only while the node has none of this proxy's requests at all (a load, on a
  small box a swap, waits for the node to drain).
- **Order of service** (:class:`Turns`): the highest priority first; within a priority, the
  caller served least recently; within a caller, arrival order.
- **Collation**: a node about to start a request whose model it does not hold serves a waiting
  request for a model it does hold first, unless the first has waited ``collate`` already.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import NamedTuple

from attrs import frozen

from nvpair.engines.caller import Priority
from nvpair.engines.loadstate import LoadState

#: Requests an engine serves at once per model when it says nothing and the fleet file sets no
#: ``parallel``: Ollama's ``OLLAMA_NUM_PARALLEL`` (1 since v0.10), LM Studio's Max Concurrent
#: Predictions (4), llama-server's automatic ``--parallel`` (4 slots).
DEFAULT_PARALLEL = {"ollama": 1, "lmstudio": 4, "llamacpp": 4}


@frozen
class QueueOptions:
    """The fleet file's ``[queue]`` (docs/fleet-scheduling.md#the-queue).

    :ivar enabled: false: every request is dispatched at once, as without a queue.
    :ivar max_wait: seconds a request may wait in all before 503 ``queue-timeout``.
    :ivar max_depth: requests waiting per (facade, model) at most; one more is 429
        ``queue-full``.
    :ivar collate: seconds a waiting request may be passed over for one whose model its node
        holds.
    """

    enabled: bool = True
    max_wait: float = 120.0
    max_depth: int = 256
    collate: float = 10.0


#: ``[queue]``'s defaults (docs/fleet-scheduling.md#the-queue).
DEFAULT_QUEUE = QueueOptions()


#: A node as the queue tells it from every other: (engine, node id).
NodeId = tuple[str, str]


class Option(NamedTuple):
    """A place a waiter could start now or later, in fleet order.

    :ivar node: (engine, node id).
    :ivar model: the node's own key for the requested model (None: a model-less request).
    :ivar warm: the node holds the model in memory (or its engine does not say).
    """

    node: NodeId
    model: str | None
    warm: bool


class Waiter:
    """One request waiting for a place (compared by identity).

    :ivar seq: its arrival order, kept through failover.
    :ivar since: when it first began to wait (clock seconds).
    :ivar caller: who it is for the turns: a key's name, else the source address.
    :ivar group: what ``max-depth`` counts it under: (facade, model).
    :ivar waited: seconds it has waited so far, every time it waited together.
    :ivar shown: its model as the status shows it.
    """

    __slots__ = ("caller", "group", "priority", "seq", "shown", "since", "waited")

    def __init__(
        self,
        seq: int,
        since: float,
        caller: str,
        priority: Priority = Priority.NORMAL,
        group: Hashable = None,
    ) -> None:
        self.seq = seq
        self.since = since
        self.caller = caller
        self.priority = priority
        self.group = group
        self.waited = 0.0
        self.shown = ""

    def __repr__(self) -> str:
        return f"Waiter({self.seq}, {self.caller!r}, {self.priority.name})"


def capacity(engine: str, load: LoadState, model: str | None, parallel: int | None) -> int:
    """How many requests for ``model`` the node's engine serves at once (docs/fleet-scheduling.md
    #capacity): the slots llama.cpp reports (a router's for that model), else the fleet file's
    ``parallel`` for the node, else the engine's default."""
    if model is not None:
        for key, slots, _ in load.model_slots:
            if key == model:
                return max(1, slots)
    if load.slots:
        return load.slots
    if parallel is not None:
        return parallel
    return DEFAULT_PARALLEL.get(engine, 1)


class Ledger:
    """This proxy's requests in flight per node and per (node, model), and what a node's
    engine says of its load: whether an option is startable now.

    :param load: a node's load state now (what its last poll said).
    :param parallel: a node's ``parallel`` from the fleet file, if any.
    """

    def __init__(
        self,
        load: Callable[[NodeId], LoadState],
        parallel: Callable[[NodeId], int | None],
    ) -> None:
        self._load = load
        self._parallel = parallel
        self._node: dict[NodeId, int] = {}
        self._model: dict[tuple[NodeId, str | None], int] = {}

    def in_flight(self, node: NodeId, model: str | None = None, *, any_model: bool = True) -> int:
        """This proxy's requests on ``node`` (for ``model`` only, unless ``any_model``)."""
        if any_model:
            return self._node.get(node, 0)
        return self._model.get((node, model), 0)

    def startable(self, option: Option) -> bool:
        """Whether one more request can start at ``option`` now."""
        node, model, warm = option
        own_node = self._node.get(node, 0)
        if not warm and own_node:
            return False
        load = self._load(node)
        engine, _ = node
        per_model = model is not None and (
            engine != "llamacpp" or any(key == model for key, _, _ in load.model_slots)
        )
        if per_model:
            own = self._model.get((node, model), 0)
            busy = next((b for key, _, b in load.model_slots if key == model), 0)
        else:
            # One llama-server is one model: its slots are the node's.
            own, busy = own_node, load.busy
        return own + busy < capacity(engine, load, model, self._parallel(node))

    def take(self, option: Option) -> None:
        """A request starts at ``option``."""
        self._node[option.node] = self._node.get(option.node, 0) + 1
        key = (option.node, option.model)
        self._model[key] = self._model.get(key, 0) + 1

    def give_back(self, option: Option) -> None:
        """A request that started at ``option`` ended."""
        node_count = self._node.get(option.node, 0) - 1
        if node_count > 0:
            self._node[option.node] = node_count
        else:
            self._node.pop(option.node, None)
        key = (option.node, option.model)
        model_count = self._model.get(key, 0) - 1
        if model_count > 0:
            self._model[key] = model_count
        else:
            self._model.pop(key, None)


class Turns:
    """Whose turn it is: priority, then the caller served least recently, then arrival."""

    def __init__(self) -> None:
        self._served: dict[str, int] = {}
        self._count = 0

    def key(self, waiter: Waiter) -> tuple[int, int, int]:
        return (waiter.priority, self._served.get(waiter.caller, -1), waiter.seq)

    def served(self, caller: str) -> None:
        self._count += 1
        self._served[caller] = self._count

    def __len__(self) -> int:
        return len(self._served)

    def keep(self, callers: Iterable[str]) -> None:
        """Forget every caller but ``callers`` (those waiting): a caller back after a quiet
        spell is served as one never served, which is what it is to the others now."""
        kept = set(callers)
        self._served = {c: n for c, n in self._served.items() if c in kept}


def _itself(waiter: Waiter) -> Hashable:
    return waiter


def pump(
    waiting: Sequence[Waiter],
    options: Callable[[Waiter], Sequence[Option]],
    ledger: Ledger,
    turns: Turns,
    collate: float,
    now: float,
    alike: Callable[[Waiter], Hashable] = _itself,
) -> list[tuple[Waiter, Option]]:
    """Every grant that can be made now, in the order they are made; the ledger and the turns
    account for each.

    The waiter whose turn it is (:class:`Turns`) among those with a startable option takes its
    first startable option in fleet order — unless that option's node does not hold its model
    and another waiter (the first in turn) has a startable option there for a model it does
    hold: that one goes first, while the first has waited less than ``collate``.

    :param alike: what waiters share when their options are the same places in some order (a
        model, a caller's key, the nodes it tried): once one of them has nothing startable, none
        has, for the rest of the pump, since each grant only takes room. A saturated fleet with
        many waiting then asks for one ordering per kind, not one per waiter
        (docs/fleet-scheduling.md#the-queue).
    """
    granted: list[tuple[Waiter, Option]] = []
    # Within a pump nothing but the ledger changes, and a grant only takes room: a waiter's
    # options are asked once, and a kind found with nothing startable stays so.
    known: dict[Waiter, Sequence[Option]] = {}
    stuck: set[Hashable] = set()

    def options_of(waiter: Waiter) -> Sequence[Option]:
        found = known.get(waiter)
        if found is None:
            found = known[waiter] = options(waiter)
        return found

    def startable(waiter: Waiter) -> Option | None:
        kind = alike(waiter)
        if kind in stuck:
            return None
        option = next((o for o in options_of(waiter) if ledger.startable(o)), None)
        if option is None:
            stuck.add(kind)
        return option

    pending = sorted(waiting, key=turns.key)
    while pending:
        chosen: tuple[Waiter, Option] | None = None
        for waiter in pending:
            option = startable(waiter)
            if option is not None:
                chosen = (waiter, option)
                break
        if chosen is None:
            break
        waiter, option = chosen
        if not option.warm and now - waiter.since < collate:
            chosen = _collated(pending, waiter, option.node, options_of, ledger) or chosen
            waiter, option = chosen
        ledger.take(option)
        turns.served(waiter.caller)
        pending.remove(waiter)
        granted.append((waiter, option))
        pending.sort(key=turns.key)
    return granted


def _collated(
    pending: Sequence[Waiter],
    passed: Waiter,
    node: NodeId,
    options: Callable[[Waiter], Sequence[Option]],
    ledger: Ledger,
) -> tuple[Waiter, Option] | None:
    """The first waiter in turn, other than ``passed``, that ``node`` can start now for a
    model it holds."""
    for waiter in pending:
        if waiter is passed:
            continue
        for option in options(waiter):
            if option.node == node and option.warm and ledger.startable(option):
                return waiter, option
    return None
