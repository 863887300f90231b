"""Pure candidate selection: filter to owners, then order pin → priority → default
(docs/candidate-order.md#order), or in standalone fleet mode pin → warm → busy → cold
(docs/fleet-scheduling.md#order).

Values in, values out: no reactor, no I/O. The request path calls :func:`plan` (or
:func:`fleet_plan`) once per round with the live snapshot, so a node that recovered or a model
that finished pulling becomes eligible mid-retry.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import NamedTuple

from nvpair.control.affinity import BUSIER, HELD_BACK, TIER, Conversation
from nvpair.control.state import Discovery, Node, Priority
from nvpair.engines.loadstate import UNKNOWN, LoadState


def owners(discovery: Discovery, model_key: str | None) -> list[Node]:
    """Nodes whose inventory advertises ``model_key``.

    ``None`` means a model-less inference body on an engine that serves whatever it has loaded:
    every node advertising at least one model is eligible (docs/candidate-order.md#owners,
    "Model-less inference")."""
    return list(discovery.owners(model_key))


def advertises(node: Node, model_key: str | None) -> bool:
    """Whether ``node`` is an owner of ``model_key`` (the same rule as :func:`owners`)."""
    return bool(node.model_keys) if model_key is None else model_key in node.model_keys


def default_order(nodes: Sequence[Node]) -> list[Node]:
    """The deterministic default order: the local node first, then by node id ascending."""
    return sorted(nodes, key=lambda node: (not node.local, node.id))


class Plan(NamedTuple):
    """One round's candidates in dispatch order (a NamedTuple, as every value made per request:
    docs/performance.md#per-dispatch-overheads).

    :ivar candidates: the order to try them in.
    :ivar pinned: whether the first candidate is an eligible manual pin.
    :ivar reserve: the node to reserve for this round (the least-loaded scheduler-listed
        candidate), or None when an eligible pin applies or nothing is listed.
    :ivar affine: in fleet mode, the node that goes first behind any pin because the
        request's conversation was served there (docs/fleet-scheduling.md#affinity-order);
        None when affinity chose none.
    :ivar conversation: in fleet mode with affinity, for a request with prefix keys: what the
        order knew of its conversation (docs/fleet-scheduling.md
        #what-the-operator-sees-of-affinity); None otherwise.
    """

    candidates: tuple[Node, ...]
    pinned: bool
    reserve: str | None
    affine: str | None = None
    conversation: Conversation | None = None


def estimated_load(priority: Priority, node_id: str, reservations: Mapping[str, int]) -> float:
    """``pending + gpuPressure + reservations`` (docs/candidate-order.md#reservations); unlisted
    scheduler fields count 0."""
    entry = priority.entry(node_id)
    base = 0.0 if entry is None else entry.pending + entry.gpu_pressure
    return base + reservations.get(node_id, 0)


def order(nodes: Sequence[Node], pin: str | None, priority: Priority) -> list[Node]:
    """Pin → scheduler priority → default order, without any load consideration.

    This is the node order of fan-out requests (inventories, preflights) and the starting
    point of :func:`plan`.
    """
    by_default = default_order(nodes)
    pinned = [node for node in by_default if node.id == pin]
    rest = [node for node in by_default if node.id != pin]
    if priority.entries is None:
        return pinned + rest
    rank = {entry.id: index for index, entry in enumerate(priority.entries)}
    listed = sorted((n for n in rest if n.id in rank), key=lambda n: rank[n.id])
    return pinned + listed + [n for n in rest if n.id not in rank]


def plan(
    eligible: Sequence[Node],
    pin: str | None,
    priority: Priority,
    reservations: Mapping[str, int],
) -> Plan:
    """Order ``eligible`` owners for dispatch (docs/candidate-order.md#order).

    An ineligible pin (the pinned node does not advertise the model) is ignored: a manual
    selection never overrides the capability gate, and failover never broadens past
    ``eligible``.
    """
    ordered = order(eligible, pin, priority)
    pinned = bool(ordered) and ordered[0].id == pin
    head = ordered[:1] if pinned else []
    rest = ordered[1:] if pinned else ordered
    if priority.entries is None:
        # Before any scheduler snapshot (and always in fleet mode) every node is listed.
        listed, unlisted = rest, []
    else:
        ids = {entry.id for entry in priority.entries}
        listed = [n for n in rest if n.id in ids]
        unlisted = [n for n in rest if n.id not in ids]

    reserve: str | None = None
    if listed:
        # min() keeps the first of equals, so ties go to the earlier in priority order.
        least = min(listed, key=lambda n: estimated_load(priority, n.id, reservations))
        listed.remove(least)
        listed.insert(0, least)
        if not pinned:
            reserve = least.id
    return Plan(tuple(head + listed + unlisted), pinned, reserve)


# -- standalone fleet mode ------------------------------------------------------------------------


class Tier(enum.IntEnum):
    """How ready a node is to serve a model now, best first (docs/fleet-scheduling.md#order)."""

    #: The model is in memory and a slot is free: it starts at once.
    WARM_FREE = 0
    #: The model is in memory, every slot is busy: it waits behind others, but never loads.
    WARM_BUSY = 1
    #: Not in memory, or the engine did not say: the first request may wait for a load.
    COLD = 2


class Standing(NamedTuple):
    """What fleet mode knows about one candidate besides its inventory (one per owner per
    round: a NamedTuple).

    :ivar load: what the engine's last poll said about its load, with the models this proxy
        has dispatched to it since counted in memory
        (docs/fleet-scheduling.md#dispatched-is-loading).
    :ivar held: passive health holds the node back (docs/fleet-scheduling.md#passive-health).
    :ivar last_dispatch: when this proxy last dispatched to the node, as an ordinal over all of
        its dispatches (greater is more recent; 0: never). An ordinal, not a clock reading:
        two dispatches within one reactor turn read the same time, yet one came first
        (docs/fleet-scheduling.md#ties-spread).
    """

    load: LoadState = UNKNOWN
    held: bool = False
    last_dispatch: int = 0


def tier(node: Node, model_key: str | None, load: LoadState, reserved: int) -> Tier:
    """The node's tier for ``model_key`` with ``reserved`` of this proxy's requests on it.

    The engine reports what it holds in memory, and its slots, under its own names: a model
    asked for by another name (docs/model-names.md) is looked up under the node's."""
    own = node.own_key(model_key)
    if not load.in_memory(own, node.model_keys):
        return Tier.COLD
    return Tier.WARM_FREE if load.free_slot(reserved, own) else Tier.WARM_BUSY


def fleet_load(load: LoadState, reserved: int) -> int:
    """Estimated load in fleet mode: this proxy's own requests on the node (its reservations:
    with no scheduler snapshot ever arriving, they are exactly its dispatches in flight), plus
    the slots its engine reported busy with other clients' work."""
    return reserved + load.busy


class Affine(NamedTuple):
    """Where affinity would send a request first (docs/fleet-scheduling.md#affinity-order; one
    per request: a NamedTuple).

    :ivar engine: the engine of the node its conversation was last served by (a facade
        reaching several engines ranks nodes of each, and a node id names one per engine).
    :ivar node: that node.
    :ivar slack: how much busier than the least-loaded warm owner it may be.
    """

    engine: str
    node: str
    slack: int


def fleet_plan(
    eligible: Sequence[Node],
    pin: str | None,
    model_key: str | None,
    standing: Callable[[str], Standing],
    reservations: Mapping[str, int],
    affine: Affine | None = None,
) -> Plan:
    """Order ``eligible`` owners in standalone fleet mode (docs/fleet-scheduling.md#order).

    The pin first, then the nodes not held back, by tier (:class:`Tier`), within a tier by
    :func:`fleet_load`, ties to the one dispatched to least recently
    (:attr:`Standing.last_dispatch`), then by node id; then the held-back nodes in the same
    order. A node whose engine is loading is left out while any other owner is there; when
    every owner is loading they all stay, least loaded first. ``affine``'s node goes first
    behind the pin when it may (:func:`ranked_plan`). The first candidate behind the pin is the
    one reserved.
    """
    pinned = [node for node in eligible if node.id == pin][:1]
    rest = [(node, model_key, standing(node.id)) for node in eligible if node.id != pin]
    return ranked_plan(pinned, rest, reservations, affine)


#: A candidate as fleet mode ranks it: the node, the requested model as its engine keys it, and
#: what is known of it (a facade reaching several engines ranks each node by its own engine's key
#: and standing). A plain tuple: one is made per owner per round.
Ranked = tuple[Node, str | None, Standing]


#: A candidate's place in fleet order: held back, tier, estimated load, last dispatch, node id.
Rank = tuple[bool, Tier, int, int, str]


def ranked_plan(
    pinned: Sequence[Node],
    rest: Sequence[Ranked],
    reservations: Mapping[str, int],
    affine: Affine | None = None,
) -> Plan:
    """``pinned`` (at most one node) first, then ``rest`` in fleet order (:func:`fleet_plan`);
    the first of ``rest`` is reserved when nothing is pinned. Ties keep ``rest``'s order.

    ``affine``'s node then goes first among ``rest`` when it is warm, not held back, in the
    best tier there is, and at most ``affine.slack`` busier than the least-loaded warm owner
    (docs/fleet-scheduling.md#affinity-order): the order of the others stays as it was.
    """
    ready = [(node, key, standing) for node, key, standing in rest if not standing.load.loading]
    if ready or pinned:
        rest = ready
    ranks: list[tuple[Rank, Node]] = []
    for node, model_key, (load, held, last) in rest:
        reserved = reservations.get(node.id, 0)
        # Ties of tier and load go to the owner dispatched to least recently: by node id alone,
        # every idle-time request and every new conversation would start on the lowest id
        # (docs/fleet-scheduling.md#ties-spread).
        its_tier = tier(node, model_key, load, reserved)
        rank = (held, its_tier, fleet_load(load, reserved), last, node.id)
        ranks.append((rank, node))
    ranks.sort(key=itemgetter(0))
    chosen, why = (None, None) if affine is None else _affine_first(ranks, affine)
    ordered = [node for _, node in ranks]
    if chosen is not None:
        ordered.remove(chosen)
        ordered.insert(0, chosen)
    reserve = ordered[0].id if ordered and not pinned else None
    return Plan(
        tuple([*pinned, *ordered]),
        bool(pinned),
        reserve,
        None if chosen is None else chosen.id,
        None if affine is None else Conversation((affine.engine, affine.node), why),
    )


def _affine_first(
    ranks: Sequence[tuple[Rank, Node]], affine: Affine
) -> tuple[Node | None, str | None]:
    """``affine``'s node, if it may go first among ``ranks`` (sorted best first); else None
    and why not (docs/fleet-scheduling.md#what-the-operator-sees-of-affinity)."""
    engine, wanted, slack = affine
    for rank, node in ranks:
        if node.id == wanted and node.engine == engine:
            held, its_tier, load, *_ = rank
            break
    else:
        # Left out of the round: its engine is loading while another owner is not.
        return None, TIER
    (best_held, best_tier, *_), _best = ranks[0]
    if held or best_held:
        return None, HELD_BACK
    if its_tier != best_tier or its_tier is Tier.COLD:
        return None, TIER
    # Sorted best first: the warm owners not held back lead (of either warm tier).
    least = load
    for (other_held, other_tier, other_load, *_), _node in ranks:
        if other_held or other_tier is Tier.COLD:
            break
        if other_load < least:
            least = other_load
    return (node, None) if load <= least + slack else (None, BUSIER)
