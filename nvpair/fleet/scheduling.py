"""Standalone fleet mode plays the scheduler (docs/fleet-scheduling.md).

In broker mode the scheduler ranks nodes; in fleet mode there is none, so the proxy ranks them
itself from two things it learns on its own: each engine's load state, polled with the
inventory (:mod:`nvpair.engines.loadstate`, :mod:`nvpair.fleet.polls`), and each node's passive
health, from the outcome of its attempts (:mod:`nvpair.fleet.health`); ties go to the owner it
dispatched to least recently (docs/fleet-scheduling.md#ties-spread). :class:`FleetScheduler`
holds both and is the request path's :class:`~nvpair.dispatch.seams.Scheduling` in this mode: the
order of a round (:meth:`FleetScheduler.plan`, the pure :func:`nvpair.control.routing.fleet_plan`
on live values), what an attempt's outcome says about its node, and how long to wait for an owner
(``--owner-wait``). Between two polls it also remembers what it has dispatched itself: a model just
sent to a node counts as in memory there (loading) until a poll asked after the dispatch says
otherwise (docs/fleet-scheduling.md#dispatched-is-loading). A node whose last liveness probe went
unanswered (:mod:`nvpair.fleet.liveness`) goes last, as a held-back one does
(docs/fleet-scheduling.md#hung-nodes). And it keeps a conversation where its cache is: the
node that served a request's longest known prefix goes first among the warm owners, within a
slack, unless its own answers say its cache does not keep what it is sent
(docs/fleet-scheduling.md#conversations-go-where-their-cache-is).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial

from attrs import evolve
from twisted.internet.interfaces import IReactorTime

from nvpair.control.affinity import (
    DEFAULT_AFFINITY,
    SUSPENDED,
    AffinityOptions,
    CacheLedger,
    Conversation,
    Owner,
    PrefixTable,
    scope,
)
from nvpair.control.routing import Affine, Plan, Ranked, Standing, fleet_plan, ranked_plan
from nvpair.control.state import Node
from nvpair.engines.conversation import prefix_keys
from nvpair.engines.inferstats import Stats
from nvpair.engines.loadstate import UNKNOWN, LoadState, unseen
from nvpair.engines.patternnames import PatternKey
from nvpair.engines.table import ENGINES
from nvpair.fleet.health import HealthPolicy, PassiveHealth
from nvpair.fleet.liveness import LivenessProbes


class FleetScheduler:
    """Load states and passive health of every (engine, node), read per round.

    :param clock: passive health's cool-downs.
    :param policy: passive health's options.
    :param own_in_flight: this proxy's dispatches in flight to (engine, node): subtracted from
        the busy slots an engine reports, which include them, so they are not counted twice.
    :param liveness: what the liveness probes say (docs/fleet-scheduling.md#hung-nodes): a
        node whose last probe went unanswered goes to the end of the order; None: no probes.
    :param owner_wait: seconds a request waits for an owner once every owner is down
        (``--owner-wait``): no broker's node-loss sweep ends it otherwise
        (docs/fleet-scheduling.md#owner-wait).
    :param affinity: ``[scheduling]``; a reload replaces it (:attr:`affinity`).
    :param table: where served requests' prefix keys are kept (bounded).
    """

    def __init__(
        self,
        clock: IReactorTime,
        policy: HealthPolicy,
        own_in_flight: Callable[[str, str], int] = lambda engine, node: 0,
        liveness: LivenessProbes | None = None,
        *,
        owner_wait: float = 0.0,
        affinity: AffinityOptions = DEFAULT_AFFINITY,
        table: PrefixTable | None = None,
    ) -> None:
        self.health = PassiveHealth(clock, policy)
        self.liveness = liveness
        self.owner_wait = owner_wait
        self.affinity = affinity
        self.table = PrefixTable() if table is None else table
        self.caches = CacheLedger()
        self._clock = clock
        self._own = own_in_flight
        self._loads: dict[tuple[str, str], LoadState] = {}
        # (engine, node) -> model key -> clock time of the latest dispatch no poll speaks for yet
        self._sent: dict[tuple[str, str], dict[str, float]] = {}
        # (engine, node) -> the most models it has been seen holding at once: a load beyond
        # that evicts one (docs/fleet-scheduling.md#dispatched-is-loading)
        self._room: dict[tuple[str, str], int] = {}
        # (engine, node) -> the model keys it last listed, while it is out of discovery
        self._away: dict[tuple[str, str], frozenset[str]] = {}
        # (engine, node) -> the ordinal of this proxy's latest dispatch to it, and the last
        # ordinal given: ties of the order go to the least recent
        # (docs/fleet-scheduling.md#ties-spread)
        self._last: dict[tuple[str, str], int] = {}
        self._dispatches = 0
        #: Called after every poll's reading: the fleet's queue looks for a place freed
        #: (docs/fleet-scheduling.md#the-queue).
        self.load_changed: Callable[[], None] = lambda: None
        #: Given an engine, whether a node the fleet file names for it has yet to answer its
        #: first poll or says it is loading: the fleet service's to say
        #: (docs/fleet-scheduling.md#before-the-first-poll).
        self.awaited: Callable[[str], bool] = lambda engine: False

    def load(self, engine: str, node: str) -> LoadState:
        """What ``node``'s ``engine`` said about its load at its last poll."""
        return self._loads.get((engine, node), UNKNOWN)

    def dispatched(self, engine: str, node: str, model_key: str | None) -> None:
        """An inference request for ``model_key`` is being sent to ``node`` now: its engine
        loads the model if it has not (docs/fleet-scheduling.md#dispatched-is-loading).

        On every fleet-mode attempt: a clock reading and one dictionary write (a dictionary of
        its own only at a node's first dispatch). A model-less request loads nothing.
        """
        if model_key is None:
            return
        key = (engine, node)
        sent = self._sent.get(key)
        if sent is None:
            sent = self._sent[key] = {}
        sent[model_key] = self._clock.seconds()

    def dispatching(self, engine: str, node: str, model_key: str | None) -> bool:
        """An attempt to ``node`` starts: its model counts as in memory there from now, not
        from the node's next poll, so a second request for it joins this load instead of
        starting one on another cold node. Whether it is the node's trial after a hold-back
        (docs/fleet-scheduling.md#passive-health)."""
        trial = self.health.dispatching(engine, node)
        self.dispatched(engine, node, model_key)
        self._dispatches += 1
        self._last[(engine, node)] = self._dispatches
        return trial

    def succeeded(self, engine: str, node: str) -> None:
        self.health.succeeded(engine, node)

    def failed(self, engine: str, node: str, trial: bool, why: str) -> None:
        self.health.failed(engine, node, trial, why)

    def record_load(
        self, engine: str, node: str, state: LoadState, asked_at: float | None = None
    ) -> None:
        """A poll's reading; :data:`~nvpair.engines.loadstate.UNKNOWN` forgets what was known.

        :param asked_at: when the poll was asked (clock time; None: now). The dispatches it
            cannot speak for, made after that or just before, still count on top of it; the
            others are forgotten, the reading now says whether their models are in memory.
        """
        sent = self._sent.get((engine, node))
        if sent:
            kept = unseen(sent, self._clock.seconds() if asked_at is None else asked_at)
            if kept:
                self._sent[(engine, node)] = kept
            else:
                del self._sent[(engine, node)]
        if state.busy:
            # The engine counts this proxy's own requests among its busy slots; the order
            # counts them as reservations already. A router's are on one of its models, which
            # is not known here: taken off each, a model is never thought freer than it is,
            # since the order adds all of them back as reservations.
            own = self._own(engine, node)
            state = evolve(
                state,
                busy=max(0, state.busy - own),
                model_slots=tuple((m, n, max(0, busy - own)) for m, n, busy in state.model_slots),
            )
        if state.warm is not None and not state.warm_all:
            self._room[(engine, node)] = max(self._room.get((engine, node), 1), len(state.warm))
        if state == UNKNOWN:
            self._loads.pop((engine, node), None)
        else:
            self._loads[(engine, node)] = state
        self.load_changed()

    def away(self, engine: str, node: str, models: Sequence[str] | None) -> None:
        """``node`` left discovery having last listed ``models`` (its poll fails), or (None) is
        back in it."""
        if models is None:
            self._away.pop((engine, node), None)
        else:
            if (engine, node) not in self._away:
                # Gone (its poll fails, or it hangs): whatever comes back is no longer known
                # to hold its conversations.
                self.restarted(engine, node)
            key = ENGINES[engine].model_key
            # A pattern alias's key is a key already, and no name (patternnames.PatternKey).
            self._away[(engine, node)] = frozenset(
                model if isinstance(model, PatternKey) else key(model) for model in models
            )

    def restarted(self, engine: str, node: str) -> None:
        """``node``'s ``engine`` left discovery or was seen starting again (loading as a
        whole): its cache is gone, and so are its entries in the prefix table
        (docs/fleet-scheduling.md#a-node-that-restarted-forgets)."""
        self.table.forget(engine, node)

    def owners_down(self, engine: str, model_key: str | None) -> list[str]:
        """The nodes out of discovery whose last list had ``model_key`` (None: any model), by
        id, a hung one marked so: why nobody advertises it now
        (docs/fleet-scheduling.md#every-owner-down)."""
        hung = self.liveness.hung if self.liveness is not None else None
        return [
            f"{node} (hung)" if hung is not None and hung(engine, node) else node
            for node in sorted(
                node
                for (of, node), keys in self._away.items()
                if of == engine and (model_key in keys if model_key is not None else keys)
            )
        ]

    def starting(self, engine: str) -> bool:
        return self.awaited(engine)

    def forget(self, engine: str, node: str) -> None:
        """A reload removed or moved the node: what was learned of it no longer applies."""
        self._loads.pop((engine, node), None)
        self._away.pop((engine, node), None)
        self._sent.pop((engine, node), None)
        self._room.pop((engine, node), None)
        self._last.pop((engine, node), None)
        self.health.forget(engine, node)
        self.caches.forget(engine, node)
        self.table.forget(engine, node)

    def standing(self, engine: str, node: str) -> Standing:
        """The node's last reading, with what was dispatched to it since counted in memory,
        whether it goes last (passive health holds it back, or its last liveness probe went
        unanswered), and when this proxy last dispatched to it."""
        key = (engine, node)
        load = self._loads.get(key, UNKNOWN)
        sent = self._sent.get(key)
        if sent:
            load = load.assuming(sent, self._room.get(key, 1))
        held = self.health.held(engine, node)
        if not held and self.liveness is not None:
            held = self.liveness.of(engine, node).suspect
        return Standing(load, held, self._last.get(key, 0))

    def plan(
        self,
        engine: str,
        eligible: Sequence[Node],
        pin: str | None,
        model_key: str | None,
        reservations: Mapping[str, int],
        prefix: Sequence[int] = (),
    ) -> Plan:
        """This round's candidates in fleet order, and the node to reserve; ``prefix``: the
        request's prefix keys (:meth:`prefix_of`)."""
        affine, known = self._affine({engine: model_key}, eligible, prefix)
        plan = fleet_plan(
            eligible, pin, model_key, partial(self.standing, engine), reservations, affine
        )
        return plan if known is None else plan._replace(conversation=known)

    def plan_across(
        self,
        eligible: Sequence[Node],
        model_key: Callable[[str], str | None],
        reservations: Mapping[str, int],
        prefix: Sequence[int] = (),
    ) -> Plan:
        """A round over several engines' nodes (the ``openai`` facade), in fleet order, each
        ranked by its own engine's standing and ``model_key(engine)``; no pin."""
        keys = {engine: model_key(engine) for engine in {node.engine for node in eligible}}
        ranked: list[Ranked] = [
            (node, keys[node.engine], self.standing(node.engine, node.id)) for node in eligible
        ]
        affine, known = self._affine(keys, eligible, prefix)
        plan = ranked_plan((), ranked, reservations, affine)
        return plan if known is None else plan._replace(conversation=known)

    # -- affinity (docs/fleet-scheduling.md#conversations-go-where-their-cache-is) --------------

    def reconfigure(self, affinity: AffinityOptions) -> None:
        """A reload's ``[scheduling]``. Turned off, affinity forgets what it recorded: turned
        on again later, it starts from what is served from then on."""
        if not affinity.enabled and self.affinity.enabled:
            self.table = PrefixTable(self.table.bound)
        self.affinity = affinity

    def prefix_of(self, document: object) -> tuple[int, ...]:
        """An admitted inference body's prefix keys; none while affinity is off."""
        return prefix_keys(document) if self.affinity.enabled else ()

    def _affine(
        self, keys: Mapping[str, str | None], eligible: Sequence[Node], prefix: Sequence[int]
    ) -> tuple[Affine | None, Conversation | None]:
        """Where the longest known prefix of the request was served, among ``eligible`` nodes
        whose affinity is not suspended (over every engine in ``keys``: the longest wins); and
        what the plan is to say of the conversation when the order alone cannot: that no key
        was known, or that its node's affinity is suspended (None: the order says it, or the
        request has no keys)."""
        if not prefix or not self.affinity.enabled:
            return None, None
        known = self._longest(keys, eligible, prefix, None)
        if known is None:
            return None, Conversation(None)
        now = self._clock.seconds()
        if not self.caches.suspended(known.engine, known.node, now):
            return Affine(known.engine, known.node, self.affinity.slack), None
        # Its node keeps too little: a shorter key's node, if any, may still go first.
        found = self._longest(keys, eligible, prefix, now)
        affine = None if found is None else Affine(found.engine, found.node, self.affinity.slack)
        return affine, Conversation(known, SUSPENDED)

    def _longest(
        self,
        keys: Mapping[str, str | None],
        eligible: Sequence[Node],
        prefix: Sequence[int],
        unsuspended_at: float | None,
    ) -> Owner | None:
        """The node recorded for the longest of ``prefix`` among ``eligible`` nodes, over
        every engine in ``keys``; with ``unsuspended_at``, only nodes whose affinity is not
        suspended then."""
        suspended = self.caches.suspended
        best: Owner | None = None
        best_covered = 0
        for engine, model_key in keys.items():
            # A handful of owners: a list is searched faster than a set is built.
            ids = [node.id for node in eligible if node.engine == engine]

            def usable(node: str, engine: str = engine, ids: list[str] = ids) -> bool:
                if node not in ids:
                    return False
                return unsuspended_at is None or not suspended(engine, node, unsuspended_at)

            found = self.table.owner(scope(engine, model_key), prefix, usable)
            if found is not None and (best is None or found.covered > best_covered):
                best, best_covered = Owner(engine, found.node), found.covered
        return best

    def answered(
        self,
        engine: str,
        node: str,
        model_key: str | None,
        prefix: Sequence[int],
        stats: Stats | None,
        affine: bool,
    ) -> None:
        """``node`` served a request below 400: its prefix keys now name the node, and what
        its answer said of its cache is noted (``affine``: affinity sent it there)."""
        if prefix and self.affinity.enabled:
            self.table.record(scope(engine, model_key), prefix, engine, node)
        if stats is not None and stats.cached_tokens is not None and stats.prompt_tokens:
            self.caches.reported(
                engine,
                node,
                stats.prompt_tokens,
                stats.cached_tokens,
                affine and self.affinity.enabled,
                self._clock.seconds(),
            )
