"""What standalone fleet mode's polls say, kept per engine: each pair's report and its log
lines, the nodes in each engine's discovery and the models each last listed
(docs/fleet-scheduling.md#every-configured-node-is-visible).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from attrs import evolve
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from nvpair.control.state import ControlState
from nvpair.engines.modelnames import Aliases, known_names
from nvpair.engines.table import ENGINES
from nvpair.fleet.liveness import LivenessProbes
from nvpair.fleet.nodes import discovery_nodes
from nvpair.fleet.pairs import Pair, PollState
from nvpair.fleet.scheduling import FleetScheduler

#: What a node answering its poll again is logged as, by what it was before (info).
_CAME_UP = {
    PollState.PENDING: "{node} joined {engine} discovery with {count} models",
    PollState.DOWN: "{node}'s {engine} answers again: back in discovery with {count} models",
    PollState.LOADING: "{node}'s {engine} is ready: {count} models",
}

#: What a node failing its poll is logged as, by what it was before (warn); a node that
#: stays down is not logged again.
_WENT_DOWN = {
    PollState.PENDING: "{node}'s {engine} at {url} does not answer its poll: {why}",
    PollState.UP: "{node} left {engine} discovery: poll of {url} failed ({why})",
    PollState.LOADING: "{node} left {engine} discovery: poll of {url} failed ({why})",
}


class FleetDiscovery:
    """Each running facade's discovery, from its pairs' polls.

    A node is in its engine's discovery while its last poll answered, or while its engine says
    it is loading and it once listed models (it keeps those); a hung node is left out.

    :param log: the fleet service's, so every line of the fleet reads under one namespace.
    :param urls: given an engine, each configured node's URL for it now.
    :param reported: told after each pair's report changed.
    :param aliases: the fleet file's ``[models]`` now (docs/model-names.md).
    """

    def __init__(
        self,
        clock: IReactorTime,
        control: ControlState,
        engines: Iterable[str],
        log: Logger,
        urls: Callable[[str], Mapping[str, str]],
        reported: Callable[[], None],
        aliases: Callable[[], Aliases],
        scheduler: FleetScheduler | None = None,
        liveness: LivenessProbes | None = None,
    ) -> None:
        self._clock = clock
        self._control = control
        self._log = log
        self._urls = urls
        self._reported = reported
        self._aliases = aliases
        # engine -> the [models] aliases its nodes' own names shadow, as last warned of
        self._shadowed: dict[str, tuple[str, ...]] = {}
        self._scheduler = scheduler
        self._liveness = liveness
        engines = tuple(engines)
        # engine -> node id -> models from that node's last successful poll, while in discovery
        self._answered: dict[str, dict[str, tuple[str, ...]]] = {e: {} for e in engines}
        # engine -> node id -> the last models it ever answered, kept after it leaves: what a
        # node that comes back loading is known to serve.
        self._known: dict[str, dict[str, tuple[str, ...]]] = {e: {} for e in engines}

    def forget(self, engine: str, node_id: str) -> None:
        """A node the file no longer has: nothing known of it (publish to make it so)."""
        self._answered[engine].pop(node_id, None)
        self._known[engine].pop(node_id, None)

    def answered(self, pair: Pair, models: tuple[str, ...]) -> None:
        """``pair``'s model list answered ``models``."""
        came_up = _CAME_UP.get(pair.report.state)
        self._report(pair, PollState.UP, models, None)
        if came_up is not None:
            self._log.info(came_up, engine=pair.engine, node=pair.node, count=len(models))
        self._record(pair.engine, pair.node, models)

    def failed(self, pair: Pair, why: str, loading: bool) -> None:
        """``pair``'s model list failed, ``why``; ``loading``: its engine says it is loading."""
        engine, node_id = pair.engine, pair.node
        why = why[:200]
        before = pair.report.state
        known = self._known[engine].get(node_id)
        if loading:
            # A llama.cpp server loading its model answers 503 everywhere, its model list
            # included; it is no gone node. Kept with what it last listed, marked loading; one
            # never seen does not join until its models are known.
            self._report(pair, PollState.LOADING, known or (), why)
            if before is not PollState.LOADING and self._scheduler is not None:
                # A server loading as a whole has just started: what it held went with the
                # process (docs/fleet-scheduling.md#a-node-that-restarted-forgets).
                self._scheduler.restarted(engine, node_id)
            if before is not PollState.LOADING:
                self._log.info(
                    "{node}'s {engine} is loading a model{known}",
                    engine=engine,
                    node=node_id,
                    known=": in discovery with its last models" if known is not None else "",
                )
            if known is not None:
                self._record(engine, node_id, known)
            return
        self._report(pair, PollState.DOWN, (), why)
        went_down = _WENT_DOWN.get(before)
        if went_down is not None:
            self._log.warn(went_down, engine=engine, node=node_id, url=pair.url, why=why)
        self._record(engine, node_id, None)

    def _report(
        self, pair: Pair, state: PollState, models: tuple[str, ...], error: str | None
    ) -> None:
        now = self._clock.seconds()
        previous = pair.report
        since = now if state is not previous.state else previous.since
        pair.report = evolve(
            previous, state=state, models=models, last_poll=now, last_error=error, since=since
        )
        self._reported()

    def _record(self, engine: str, node_id: str, models: tuple[str, ...] | None) -> None:
        answered = self._answered[engine]
        if models is None:
            if node_id not in answered:
                return
            del answered[node_id]
        else:
            if answered.get(node_id) == models:
                return
            answered[node_id] = models
            self._known[engine][node_id] = models
        if self._scheduler is not None:
            # What a node that left last listed: who a request for it finds down.
            away = None if models is not None else self._known[engine].get(node_id, ())
            self._scheduler.away(engine, node_id, self._every_name(engine, away))
        self.publish(engine)

    def _every_name(self, engine: str, models: tuple[str, ...] | None) -> tuple[str, ...] | None:
        """``models`` and the other names a node is known by for them (file names, aliases),
        and the keys of the pattern aliases it serves: a request by any of them finds the node
        down, as one by its own name does (docs/fleet-scheduling.md#every-owner-down)."""
        if not models:
            return models
        names = known_names(ENGINES[engine], [models], self._aliases())
        caught = (other.key for other in names.patterns[0])
        return (*models, *(other.name for other in names.others[0]), *caught)

    def publish(self, engine: str) -> None:
        """A new discovery snapshot of ``engine``: the nodes in it now, at their URLs now, each
        with the other names its models are known by (docs/model-names.md).

        A hung node is left out, as one whose poll fails, and for the same reasons: nothing
        is dispatched to it, and an attempt there not yet committed is abandoned and fails
        over (docs/fleet-scheduling.md#hung-nodes).
        """
        urls = self._urls(engine)
        serving: dict[str, tuple[str, ...]] = {}
        for nid, names in self._answered[engine].items():
            if nid not in urls:
                continue
            hung = self._liveness is not None and self._liveness.hung(engine, nid)
            if self._scheduler is not None:
                # A hung owner is named when nobody serves its model (every-owner-down).
                self._scheduler.away(engine, nid, self._every_name(engine, names) if hung else None)
            if not hung:
                serving[nid] = names
        found = discovery_nodes(ENGINES[engine], serving, urls, self._aliases())
        for alias in sorted(set(found.shadowed) - set(self._shadowed.get(engine, ()))):
            self._log.warn(
                "[models] alias {alias} is also a name {engine} reports: a request for it goes "
                "to that model, as if the alias were not there",
                alias=alias,
                engine=engine,
            )
        self._shadowed[engine] = found.shadowed
        self._control.set_discovery(engine, found.nodes, found.patterns)
