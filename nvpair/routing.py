"""Pure candidate selection: filter to owners, then order pin → priority → default
(docs/candidate-order.md#order).

Values in, values out: no reactor, no I/O. The request path calls :func:`plan` once per round
with the live snapshot, so a node that recovered or a model that finished pulling becomes
eligible mid-retry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from attrs import frozen

from nvpair.control import Discovery, Node, Priority


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


@frozen
class Plan:
    """One round's candidates in dispatch order.

    :ivar candidates: the order to try them in.
    :ivar pinned: whether the first candidate is an eligible manual pin.
    :ivar reserve: the node to reserve for this round (the least-loaded scheduler-listed
        candidate), or None when an eligible pin applies or nothing is listed.
    """

    candidates: tuple[Node, ...]
    pinned: bool
    reserve: str | None


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
