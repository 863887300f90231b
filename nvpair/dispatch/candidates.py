"""Which nodes a request may go to, read from the live control state (docs/candidate-order.md).

The ordering itself is pure (:mod:`nvpair.control.routing`); this module applies it to what the
control state holds right now: the discovery snapshot, the pin and the process's reservations,
ordered by the mode's :class:`~nvpair.dispatch.seams.Scheduling` (the scheduler's priority list in
broker mode, the fleet's own standing of each node in standalone fleet mode). There is no
memory of past nodes: each plan and each pre-dispatch check reads the live snapshot. A facade
that reaches several engines' nodes (the ``openai`` facade) plans over the owners of every
engine it serves, each node dialled as its own engine's (docs/openai-facade.md#owners).
"""

from __future__ import annotations

from nvpair.control.keyscope import KeyScope
from nvpair.control.naming import pattern_taking
from nvpair.control.reservations import Reservations
from nvpair.control.routing import Plan, advertises, order, owners
from nvpair.control.state import ControlState, Node
from nvpair.dispatch.seams import Scheduling
from nvpair.engines.patternnames import PatternKey
from nvpair.engines.table import ENGINES, RouteClass
from nvpair.facades.facade import Admitted


class NoAddress(LookupError):
    """The node has no address to dial (a local node before ``node/set-local-backend``)."""


def model_key_on(engine: str, admitted: Admitted) -> str | None:
    """The model ``admitted`` names, as ``engine``'s inventories key it.

    The one place a requested name meets a node's inventory: on the facade's own engine it is
    the key admission computed; a facade that reaches other engines' nodes compares the name
    as each engine does (an Ollama node lists ``llama3`` as ``llama3:latest``). A file name or
    an alias is a key like any other there (a fleet node carries every name it answers to,
    docs/model-names.md), so the node's own name for it is ``node.own_name`` of this key. A
    pattern alias that took the request has one key on every engine
    (:meth:`Candidates.resolved`).
    """
    if admitted.model is None or admitted.engine.id == engine or admitted.pattern is not None:
        return admitted.model_key
    return ENGINES[engine].model_key(admitted.model)


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

    def resolved(self, admitted: Admitted) -> Admitted:
        """``admitted``, routed by the pattern alias that takes its model when no name the
        fleet knows is it (docs/model-names.md#pattern-aliases). Inference only: a route that
        pulls, deletes or loads a model it names must never act on another."""
        if admitted.model is None or admitted.route is not RouteClass.INFERENCE:
            return admitted
        pattern = pattern_taking(
            admitted.engine, admitted.model, self._control.discovery, self._down
        )
        if pattern is None:
            return admitted
        return admitted._replace(model_key=PatternKey(pattern), pattern=pattern)

    def _down(self, engine: str, model_key: str) -> bool:
        return bool(self._scheduling.owners_down(engine, model_key))

    def owners(self, engine: str, admitted: Admitted) -> list[Node]:
        """``engine``'s nodes that list the model ``admitted`` names (no model named: every
        node that lists one), and, for a key with model patterns, hold a model the key may
        use there (docs/lan.md#what-a-key-can-and-cannot-do). Every facade finds its owners
        here."""
        key = model_key_on(engine, admitted)
        found = owners(self._control.discovery(engine), key)
        scope = self._scope(admitted)
        if scope is None or key is None:
            return found
        return [node for node in found if scope.node_allowed(node, key)]

    def _scope(self, admitted: Admitted) -> KeyScope | None:
        caller = admitted.caller
        if caller is None or not caller.models:
            return None
        return KeyScope(caller.models, admitted.engine, self._control.discovery)

    def plan(self, admitted: Admitted) -> Plan:
        """This round's candidates, in order, and the node to reserve."""
        facade = admitted.engine
        if facade.spans_engines:
            return self._plan_across(admitted)
        engine = facade.id
        if admitted.route is RouteClass.INFERENCE:
            eligible = self.owners(engine, admitted)
        else:
            # Other routes go to the named model's owners when any node has it, else to any
            # node of the engine (docs/request-path.md#route-classes); a keyed request whose
            # model some node has goes to none of them but those its key allows.
            discovery = self._control.discovery(engine)
            named = self.owners(engine, admitted) if admitted.model_key else []
            has_owner = named or (admitted.model_key and discovery.owners(admitted.model_key))
            eligible = named if has_owner else list(discovery.nodes)
        # A node with nothing to dial (a local node before its backend is known) is no
        # candidate: trying it would cost an attempt and report a dispatch that never left.
        dialable = [node for node in eligible if self.dialable(engine, node)]
        return self._scheduling.plan(
            engine,
            dialable,
            self._control.pin(engine),
            admitted.model_key,
            self._reservations.counts,
            admitted.prefix,
        )

    def _plan_across(self, admitted: Admitted) -> Plan:
        """The owners of every engine the facade serves, in one order: what each node's own
        engine says of its load and health ranks it among the others (no pin: a pin is an
        engine's)."""
        dialable = [
            node
            for engine in admitted.engine.serves
            for node in self.owners(engine, admitted)
            if self.dialable(engine, node)
        ]
        return self._scheduling.plan_across(
            dialable,
            lambda engine: model_key_on(engine, admitted),
            self._reservations.counts,
            admitted.prefix,
        )

    def live(self, admitted: Admitted, node: Node) -> Node | None:
        """``node`` as the live snapshot has it now, if it is still one of the owners.

        A round is planned once; a node that left discovery (or stopped advertising the
        model) since is skipped at no attempt's cost, and one whose URL changed is dialled
        where it is now.
        """
        engine = node.engine
        current = self._control.discovery(engine).node(node.id)
        if current is None or not self.dialable(engine, current):
            return None
        key = model_key_on(engine, admitted)
        if not advertises(current, key):
            return None
        scope = self._scope(admitted)
        if scope is not None and key is not None and not scope.node_allowed(current, key):
            return None
        return current

    def every_node(self, admitted: Admitted) -> list[Node]:
        """Every node of every engine the facade serves, in candidate order (fleet-wide
        requests); a pin is its engine's facade's own."""
        control, facade = self._control, admitted.engine
        nodes = [node for engine in facade.serves for node in control.discovery(engine).nodes]
        pin = None if facade.spans_engines else control.pin(facade.id)
        return order(nodes, pin, control.priority)

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
