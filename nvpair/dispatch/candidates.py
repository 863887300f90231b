"""Which nodes a request may go to, read from the live control state (docs/candidate-order.md).

The ordering itself is pure (:mod:`nvpair.control.routing`); this module applies it to what the
control state holds right now: the discovery snapshot, the pin and the process's reservations,
ordered by the mode's :class:`~nvpair.dispatch.seams.Scheduling` (the scheduler's priority list in
broker mode, the fleet's own standing of each node in standalone fleet mode). There is no
memory of past nodes: each plan and each pre-dispatch check reads the live snapshot.
"""

from __future__ import annotations

from nvpair.control.reservations import Reservations
from nvpair.control.routing import Plan, advertises, order, owners
from nvpair.control.state import ControlState, Node
from nvpair.dispatch.seams import Scheduling
from nvpair.engines.table import RouteClass
from nvpair.facades.facade import Admitted


class NoAddress(LookupError):
    """The node has no address to dial (a local node before ``node/set-local-backend``)."""


class Candidates:
    """Plans and checks candidates against the live control state.

    :param scheduling: what orders a round: broker mode's or standalone fleet mode's.
    """

    def __init__(
        self, control: ControlState, reservations: Reservations, scheduling: Scheduling
    ) -> None:
        self._control = control
        self._reservations = reservations
        self._scheduling = scheduling

    def plan(self, admitted: Admitted) -> Plan:
        """This round's candidates, in order, and the node to reserve."""
        engine = admitted.engine.id
        discovery = self._control.discovery(engine)
        if admitted.route is RouteClass.INFERENCE:
            eligible = owners(discovery, admitted.model_key)
        else:
            # Other routes go to the named model's owners when any node has it, else to any
            # node of the engine (docs/request-path.md#route-classes).
            named = owners(discovery, admitted.model_key) if admitted.model_key else []
            eligible = named or list(discovery.nodes)
        # A node with nothing to dial (a local node before its backend is known) is no
        # candidate: trying it would cost an attempt and report a dispatch that never left.
        dialable = [node for node in eligible if self.dialable(engine, node)]
        return self._scheduling.plan(
            engine,
            dialable,
            self._control.pin(engine),
            admitted.model_key,
            self._reservations.counts,
        )

    def live(self, admitted: Admitted, node: Node) -> Node | None:
        """``node`` as the live snapshot has it now, if it is still one of the owners.

        A round is planned once; a node that left discovery (or stopped advertising the
        model) since is skipped at no attempt's cost, and one whose URL changed is dialled
        where it is now.
        """
        engine = admitted.engine.id
        current = self._control.discovery(engine).node(node.id)
        if current is None or not self.dialable(engine, current):
            return None
        return current if advertises(current, admitted.model_key) else None

    def every_node(self, engine: str) -> list[Node]:
        """Every node of the engine in candidate order (fleet-wide requests)."""
        control = self._control
        return order(control.discovery(engine).nodes, control.pin(engine), control.priority)

    def dialable(self, engine: str, node: Node) -> bool:
        return not node.local or self._control.local_backend(engine) is not None

    def base_url(self, engine: str, node: Node) -> str:
        """Where to dial ``node``; :class:`NoAddress` when there is nowhere."""
        url = self._control.local_backend(engine) if node.local else node.url
        if not url:
            raise NoAddress(f"node {node.id} has no address")
        return url

    def maybe_base_url(self, engine: str, node: Node) -> str | None:
        try:
            return self.base_url(engine, node)
        except NoAddress:
            return None
